"""The host collector: the host's CPU, memory and disk, and the processes holding the chips (``collector``)."""
