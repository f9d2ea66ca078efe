"""What ``rosterd up`` says, on the terminal (layer 8): :class:`ConsoleReporter`, the Rich
implementation of ``rosterd.up.report.Reporter``.

Rich (the CLI's library for tables and styles) renders the plan as one table per node
and each line in the style of its level; a warning about the input goes to stderr as
``warning: ...``, everything else to stdout. Names are never read as Rich markup.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from rosterd.fleet_scheduler.effects import Level
from rosterd.up.report import PlanTable

_STYLES = {
    Level.INFO: None,
    Level.OK: "green",
    Level.NOTICE: "yellow",
    Level.WARNING: "yellow",
    Level.ERROR: "red",
}
_COLUMNS = ("role", "flavor", "model", "ram_gb", "GiB", "class", "sticky", "residency")


class ConsoleReporter:
    """``rosterd up``'s reporter on ``out`` (the plan and progress) and ``err`` (warnings)."""

    def __init__(self, out: Console, err: Console) -> None:
        self.out = out
        self.err = err

    def say(self, level: Level, text: str) -> None:
        """One line in the style of ``level``; a ``WARNING`` on ``err`` as ``warning: ...``."""
        if level is Level.WARNING:
            self.err.print(Text(f"warning: {text}", style="yellow"), soft_wrap=True)
            return
        self.out.print(Text(text, style=_STYLES[level] or ""), soft_wrap=True)

    def plan(self, table: PlanTable) -> None:
        """The plan: a table per node, then the unplaced roles and the skipped entries."""
        for node in table.nodes:
            shown = Table(title=node.title, title_justify="left")
            for column in _COLUMNS:
                shown.add_column(
                    column,
                    justify="right" if column in ("ram_gb", "GiB") else "left",
                    no_wrap=column not in ("role", "model"),
                    overflow="fold",  # a long name wraps, never cut to "gemma-3-2…"
                )
            for row in node.rows:
                shown.add_row(
                    Text(row.role),
                    row.flavor,
                    Text(row.model),
                    row.ram_gb,
                    row.gib,
                    row.latency_class,
                    row.sticky,
                    row.residency,
                )
            if node.caption is not None:
                shown.caption = node.caption
                shown.caption_justify = "left"
            self.out.print(shown)
        if table.unplaced:
            self.out.print(f"[bold]unplaced roles ({len(table.unplaced)}):[/bold]")
            for role, reason in table.unplaced:
                self.out.print(Text(f"  {role}: {reason}"))
        if table.skipped:
            said = f"skipped roster entries: {table.skipped} (see `rosterd roster import`)"
            if table.served_apart:
                apart = table.served_apart
                said += (
                    f"; of those skipped as aliases, {len(apart)} ({', '.join(apart)}) served as "
                    "roles of their own: the fleet's models: gives them other weights than the "
                    "role they alias"
                )
            self.out.print(Text(said))
