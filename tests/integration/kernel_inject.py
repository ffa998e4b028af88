"""Kernel lines a test writes into the pretend nodes' kernel sources (the test cluster's
`kernel_source = "file"`), each removed afterwards by a mark of its own."""
from __future__ import annotations

import time
from typing import Any


class KernelLines:
    """Kernel lines a test writes into the pretend nodes' kernel sources, each removed afterwards
    by a mark of its own (a unique pid, or the line's own words when it carries no pid)."""

    def __init__(self, cluster: Any):
        self.cluster = cluster
        self.marks: dict[str, list[str]] = {}

    def add(self, node: str, template: str, at: float | None = None) -> str:
        """Write ``template`` with a unique ``{pid}`` (or, without one, the line as it is)."""
        if "{pid}" in template:
            pid = str(600000 + time.time_ns() % 399999)
            line, mark = template.format(pid=pid), f"pid={pid},"
        else:
            line = mark = template
        self.marks.setdefault(node, []).append(mark)
        return self.cluster.kernel_log(node, line, at=at)

    def remove(self, node: str | None = None) -> None:
        """Remove the lines written for ``node`` (all nodes' without one)."""
        for n in [node] if node else list(self.marks):
            marks = self.marks.pop(n, [])
            if not marks:
                continue
            path = self.cluster.base / "kernel" / f"{n}.log"
            path.write_text("".join(ln for ln in path.read_text().splitlines(keepends=True)
                                    if not any(m in ln for m in marks)))
