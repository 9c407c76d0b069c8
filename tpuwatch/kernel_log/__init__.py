"""Kernel log monitoring: sources (/dev/kmsg, the journal, a file), YAML rules, typed device events."""
