"""``python -m ragen_turn.inspect``: the credit inspector page, built from short real runs of the local engine
(turn_ppo and token_ppo on the same seed), checked as a person would read it: every recorded turn is on the page
with the recorded numbers, clipped turns are marked, and a real headless browser opens it with no errors."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ragen_turn.inspect import build_page, main, ratio, turn_clipped
from ragen_turn.runfiles import TRACE_FILE, read_trace

from helpers import micro_config

# a policy pushed hard (high lr, two PPO epochs, two mini-batches) against a narrow band: the second mini-batch's
# turns are clipped, so the page has clipped turns to mark
CLIPPY = ["actor_rollout_ref.actor.optim.lr=0.05", "actor_rollout_ref.actor.ppo_epochs=2",
          "actor_rollout_ref.actor.clip_ratio_low=0.02", "actor_rollout_ref.actor.clip_ratio_high=0.02",
          "trainer.val_before_train=false", "es_manager.train.env_groups=2"]


@pytest.fixture(scope="module")
def runs():
    from ragen_turn.engines.local.trainer import StarPOTrainer

    root = Path(tempfile.mkdtemp(prefix="inspect_runs_"))
    out = {}
    for algo in ("turn_ppo", "token_ppo"):
        cfg = micro_config([f"algo={algo}", *CLIPPY], run_dir=str(root / algo))
        StarPOTrainer(cfg, log=lambda *a, **k: None).fit()
        out[algo] = root / algo
    yield out
    shutil.rmtree(root, ignore_errors=True)


class Rows(HTMLParser):
    """The page's turn rows (``tr.turn``) and compare rows (``tr.cmp``): their attributes, and which rows carry
    the CLIPPED badge."""

    def __init__(self):
        super().__init__()
        self.turns, self.cmp, self.badges = [], [], 0
        self.sections = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "turn" in a.get("class", "").split():
            self.turns.append(a)
        elif tag == "tr" and a.get("class") == "cmp":
            self.cmp.append(a)
        elif tag == "span" and a.get("class") == "badge clip":
            self.badges += 1
        elif tag == "section":
            self.sections.append(a)


def parse(path: Path) -> Rows:
    p = Rows()
    p.feed(path.read_text())
    return p


def test_page_holds_every_recorded_turn_with_its_numbers_and_marks_clipped_turns(runs, tmp_path):
    run = runs["turn_ppo"]
    lines = read_trace(run / TRACE_FILE)
    assert [x["step"] for x in lines] == [1, 2]
    page = build_page(run, out=tmp_path / "p.html")
    rows = parse(page)
    recorded = [(ep["key"], t) for line in lines for ep in line["episodes"] for t in ep["turns"]]
    assert len(rows.turns) == len(recorded)
    for (key, t), row in zip(recorded, rows.turns):
        assert row["data-ep"] == key
        for k in ("h", "reward", "value", "return", "adv", "log_ratio", "clipped", "dual", "live", "token_band",
                  "n_tokens"):
            assert json.loads(row[f"data-{k}"]) == t.get(k), (key, k)
        assert ("clipped" in row["class"].split()) == turn_clipped(t)
    n_clipped = sum(turn_clipped(t) for _, t in recorded)
    assert n_clipped > 0, "the CLIPPY settings should clip some turn"
    assert rows.badges == n_clipped
    assert [s["data-step"] for s in rows.sections] == ["1", "2"]
    assert "hidden" in rows.sections[0] and "hidden" not in rows.sections[1]  # the last step is shown first
    text = page.read_text()
    for _, t in recorded:  # the text a person reads: each turn's tokens and its ratio as shown
        assert "".join(f"{tok}" for tok in t["tokens"][:1]) and f'>{ratio(t["log_ratio"]):.3g}<' in text
    assert "http://" not in text and "https://" not in text and "<link" not in text  # offline: nothing fetched


def test_compare_shows_the_same_episodes_under_both_estimators(runs, tmp_path):
    page = build_page(runs["turn_ppo"], step=1, compare=runs["token_ppo"], out=tmp_path / "c.html")
    rows = parse(page)
    a = {e["key"]: e for e in read_trace(runs["turn_ppo"] / TRACE_FILE)[0]["episodes"]}
    b = {e["key"]: e for e in read_trace(runs["token_ppo"] / TRACE_FILE)[0]["episodes"]}
    both = sorted(set(a) & set(b))
    assert both, "the same seed traces the same env groups at step 1"
    step1 = [r for r in rows.cmp[: sum(max(len(a[k]["turns"]), len(b[k]["turns"])) for k in both)]]
    for r in step1:
        k, h = r["data-key"], int(r["data-h"])
        assert json.loads(r["data-adv-a"]) == a[k]["turns"][h]["adv"]
        assert json.loads(r["data-adv-b"]) == b[k]["turns"][h]["adv"]
    # step 1 starts both runs from the same weights and sampling seed: the same responses, credited differently
    k = both[0]
    assert [t["tokens"] for t in a[k]["turns"]] == [t["tokens"] for t in b[k]["turns"]]
    assert "same responses in both runs" in page.read_text()


def test_cli_prints_the_path_and_refuses_a_run_without_trace(runs, tmp_path, capsys):
    out = tmp_path / "x.html"
    assert main([str(runs["turn_ppo"]), "--step", "1", "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == str(out) and out.is_file()
    assert main([str(tmp_path)]) == 2
    assert "error:" in capsys.readouterr().err
    assert main([str(runs["turn_ppo"]), "--step", "99"]) == 2


def test_report_links_the_trace_pages(runs, tmp_path):
    from ragen_turn.report.build import build_report

    text = build_report([str(runs["turn_ppo"])], out=tmp_path / "rep", plots=False, intervals=False)
    assert "## Trajectory traces" in text and "(inspect/turn_ppo.html)" in text
    assert (tmp_path / "rep" / "inspect" / "turn_ppo.html").is_file()


# ------------------------------------------------------------------------------------------------ a real browser
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run", "--enable-logging=stderr",
                  "--v=0"]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    return None


def open_in_browser(page: Path, *args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory(prefix="chromium_profile_") as profile:
        return subprocess.run([chromium(), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args,
                               page.resolve().as_uri()], capture_output=True, text=True, timeout=180)


def console_errors(stderr: str) -> list:
    """Chromium's log lines of page errors (``--enable-logging=stderr``: CONSOLE lines of errors, Uncaught)."""
    return [ln for ln in stderr.splitlines()
            if ("CONSOLE" in ln and ("Uncaught" in ln or "Error" in ln)) or "Uncaught" in ln]


@pytest.mark.skipif(chromium() is None, reason="no Chromium (bash scripts/chromium.sh installs Debian's)")
def test_a_headless_browser_opens_the_page_without_errors(runs, tmp_path):
    page = build_page(runs["turn_ppo"], compare=runs["token_ppo"], out=tmp_path / "b.html")
    dom = open_in_browser(page, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-ready="1"' in dom.stdout, "the page's script did not run to its end"
    assert '<pre id="errors" hidden=""></pre>' in dom.stdout, dom.stdout.split('id="errors"')[1][:500]
    assert 'style="background: rgba(' in dom.stdout  # the script coloured the tokens
    assert not console_errors(dom.stderr), console_errors(dom.stderr)
    shot = tmp_path / "shot.png"
    r = open_in_browser(page, "--window-size=1400,1000", f"--screenshot={shot}")
    assert r.returncode == 0 and shot.stat().st_size > 10_000
    keep = os.environ.get("RAGEN_TURN_INSPECT_SHOT")  # where to keep the screenshot (results/inspector/)
    if keep:
        shutil.copy(shot, keep)
