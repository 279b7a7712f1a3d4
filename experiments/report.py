"""`dsctl experiments report`: one markdown page from the sections the experiments wrote.

Each experiment leaves <name>.md (its table, ours beside the paper's, and why they differ) and
<name>.json in the output directory; the page strings them together in the registry's order, with
a header saying how and when each was run. Plots are linked by file name, so the page and the PNGs
stay together in that directory.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from .common import SOURCES_LEGEND


def write_report(out_dir: Path) -> Path:
    from .registry import REGISTRY, get

    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        from dsctl.specs import SpecError

        raise SpecError(f"{out_dir} does not exist: run the experiments into it first "
                        f"(`dsctl experiments run fig8 --quick --out {out_dir}`).", field="--out")
    lines = ["# dsctl: the papers' figures, reproduced", "",
             "Each section: what was measured on this machine (and what was predicted from it), beside the numbers "
             "the papers publish (tf.data service, SoCC'23; Cachew, ATC'22), and why they differ. Regenerate with "
             "`dsctl experiments run NAME [--quick] --out DIR` and `dsctl experiments report --out DIR`.", "",
             f"Where each number comes from: {SOURCES_LEGEND}", ""]
    overview = []
    sections = []
    for name in REGISTRY:
        module = get(name)
        md, meta = out_dir / f"{name}.md", out_dir / f"{name}.json"
        if not md.exists():
            overview.append(f"| {name} | {module.TITLE} | not run yet: `dsctl experiments run {name} --quick --out {out_dir}` |")
            continue
        info = json.loads(meta.read_text()) if meta.exists() else {}
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(md.stat().st_mtime))
        how = f"{'quick' if info.get('quick') else 'full'} run, {info.get('duration_s', 0):.0f} s, {when}"
        overview.append(f"| [{name}](#{_anchor(module.TITLE)}) | {module.TITLE} | {how} |")
        sections.append(md.read_text().rstrip())
    lines += ["| experiment | figure | run |", "| --- | --- | --- |", *overview, ""]
    for section in sections:
        lines += [section, ""]
    path = out_dir / "report.md"
    path.write_text("\n".join(lines).rstrip() + "\n")
    return path


def _anchor(title: str) -> str:
    """GitHub-style heading anchor."""
    keep = "".join(c for c in title.lower() if c.isalnum() or c in " -")
    return keep.replace(" ", "-")
