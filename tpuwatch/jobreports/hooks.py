"""The probe socket's hooks: built into the canary's book, re-pointed at a new one on reload."""

from __future__ import annotations

from tpuwatch.config import Config
from tpuwatch.jobreports.collector import JobReports
from tpuwatch.jobreports.plugin import ProbeConfig
from tpuwatch.plugincontext import Context


def build(config: Config, context: Context) -> tuple[JobReports | None, str]:
    """The socket ``probe.enabled`` asks for, judging into the canary's book (none: nothing to judge into)."""
    settings = config.section(ProbeConfig)
    if not settings.enabled:
        return None, "probe reports: off (probe.enabled)"
    if context.canary is None:
        return None, "probe reports: not served (no canary book to judge into)"
    return (JobReports(config, context.canary, context.inventory, context.pods),
            f"probe reports: judged into the canary's book, from {settings.socket}")


def keep(collector: JobReports, context: Context) -> bool:
    """Keep serving across a reload that left its settings alone, judging into the new assembly's book and
    chips; False (rebuild) when there is no book any more."""
    if context.canary is None:
        return False
    collector.book, collector.inventory = context.canary, context.inventory
    return True
