"""Every committed results page (results/**/results.md) whose runs are committed too is what
`python -m ragen_turn.report` makes from those runs today: a page cannot go stale when runs are added or moved."""
import re
from pathlib import Path

import pytest

from ragen_turn import report

REPO = Path(__file__).resolve().parents[1]
PAGES = sorted((REPO / "results").rglob("results.md"))


def _sources(text: str) -> list[str]:
    m = re.search(r"^\d+ runs in \d+ groups? from (.*)\.$", text, re.M)
    assert m, "a results page starts with 'N runs in G groups from `dir`, ...'"
    return re.findall(r"`([^`]+)`", m.group(1))


def _committed(page: Path) -> bool:
    return all(s.startswith("results/") and (REPO / s).is_dir() for s in _sources(page.read_text()))


def _comparable(text: str) -> list[str]:
    """The page's lines less the plot links (a page built with plots=False says so instead) and less the bootstrap
    CIs' bounds ("[0.43, 0.59]"): those depend on scipy's resampler, which a newer scipy may change; every point
    estimate (means, IQMs, probabilities of improvement) stays compared."""
    ci = re.compile(r"\[-?[0-9.]+, -?[0-9.]+\]")
    return [ci.sub("[CI]", ln) for ln in text.splitlines() if not ln.startswith(("Plots:", "Plot:")) and ln.strip()]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_results_page_names_committed_runs(page):
    """A generated page whose runs are not committed cannot be checked or rebuilt: keep the runs (report --keep-runs)
    or do not keep the page."""
    assert _committed(page), f"{page.relative_to(REPO)}: its runs {_sources(page.read_text())} are not in results/"


@pytest.mark.parametrize("page", [p for p in PAGES if _committed(p)], ids=lambda p: str(p.relative_to(REPO)))
def test_committed_results_page_is_rebuilt_from_its_kept_runs(page, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the page names its sources relative to the repository root
    text = page.read_text()
    header = next(ln for ln in text.splitlines() if ln.startswith("| ") and "init val success" in ln)
    group_by = [k.strip() for k in header.split("|")[1].split(",")]
    threshold = float(re.search(r"steps to ([0-9.]+)", header).group(1))
    up_to = re.search(r"^\d+ runs? in .*, each read up to step (\d+)[;.]", text, re.M)  # report --up-to-step
    paired = re.findall(r"^## Paired by seed against `(.+)`$", text, re.M)  # report --paired
    rebuilt = report.build_report(_sources(text), tmp_path, group_by=group_by, threshold=threshold, plots=False,
                                  up_to_step=int(up_to.group(1)) if up_to else None,
                                  paired=paired)
    assert _comparable(rebuilt) == _comparable(text)


def test_the_comparison_pages_are_among_those_checked():
    checked = {str(p.relative_to(REPO)) for p in PAGES if _committed(p)}
    for setting in ("long_horizon", "long_turns"):
        assert f"results/{setting}/results.md" in checked, checked
