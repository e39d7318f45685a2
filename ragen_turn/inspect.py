"""``python -m ragen_turn.inspect RUN [--step N] [--compare RUN2] [--out F]``: one self-contained HTML page of a
run's trajectory trace (``trace.jsonl``, written with ``trainer.trace_episodes``): which turns got which credit,
what the critic thought, which turns' ratios were clipped.

The page needs no server and no network (inline CSS, JS and SVG only). Per step (a selector, the arrow buttons
or the left / right keys move between steps):

- the step view: advantage by turn index, the critic's value vs the return at each turn start (with their
  explained variance over the step's traced turns), the clipped share by turn length;
- the group view: the G episodes of each traced env group side by side, their scores and turn advantages;
- the episode view: each episode's turns as rows (observation, response tokens coloured by advantage or by
  ratio, think / answer, env reward, flags, value, return, advantage, turn ratio, clipped / live shares);
  clipped turns are marked;
- with ``--compare RUN2``: the episodes both runs traced at that step (same env seed, same place in the
  group), their credit side by side.

Every number is written into the page by Python (tables, SVG); the script only shows one step at a time and
colours the tokens, so the page reads the same with scripts off (every step then shown).
"""
from __future__ import annotations

import argparse
import html
import json
import math
import re
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ragen_turn.runfiles import CONFIG_FILE, INSPECT_PAGE, TRACE_FILE, read_trace

PAGE_FILE = INSPECT_PAGE  # the page's default place: <run>/inspect.html


def esc(x: Any) -> str:
    return html.escape(str(x), quote=True)


def fmt(x: Optional[float], digits: int = 3) -> str:
    """A number as shown on the page ('-' when missing)."""
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    return f"{x:.{digits}g}"


def attr(x: Any) -> str:
    """A recorded value in a ``data-`` attribute, exactly as the trace holds it (JSON)."""
    return esc(json.dumps(x))


def ratio(log_ratio: Optional[float]) -> Optional[float]:
    return None if log_ratio is None else math.exp(min(log_ratio, 50.0))


def turn_clipped(t: Dict[str, Any]) -> bool:
    """A turn the update clipped (any of its tokens' units PPO- or dual-clipped)."""
    return bool((t.get("clipped") or 0) > 0 or (t.get("dual") or 0) > 0)


def explained_variance(pairs: Sequence[Tuple[float, float]]) -> Optional[float]:
    """``1 - Var[R - V] / Var[R]`` over ``(value, return)`` pairs (None when fewer than 2 or Var[R] = 0)."""
    if len(pairs) < 2:
        return None
    rs = [r for _, r in pairs]
    mr = sum(rs) / len(rs)
    vr = sum((r - mr) ** 2 for r in rs) / len(rs)
    d = [r - v for v, r in pairs]
    md = sum(d) / len(d)
    vd = sum((x - md) ** 2 for x in d) / len(d)
    return None if vr <= 0 else 1.0 - vd / vr


# ------------------------------------------------------------------------------------------------ SVG charts
W, HGT, PAD = 300, 180, 34


def _scale(lo: float, hi: float, a: float, b: float):
    if hi - lo < 1e-12:
        lo, hi = lo - 1, hi + 1
    return lambda x: a + (x - lo) / (hi - lo) * (b - a)


def _axes(title: str, xlab: str, ylab: str, xr: Tuple[float, float], yr: Tuple[float, float]) -> List[str]:
    return [f'<text x="{W / 2}" y="14" class="ct">{esc(title)}</text>',
            f'<line x1="{PAD}" y1="{HGT - PAD}" x2="{W - 8}" y2="{HGT - PAD}" class="ax"/>',
            f'<line x1="{PAD}" y1="22" x2="{PAD}" y2="{HGT - PAD}" class="ax"/>',
            f'<text x="{W / 2}" y="{HGT - 4}" class="cl">{esc(xlab)}</text>',
            f'<text x="10" y="{HGT / 2}" class="cl" transform="rotate(-90 10 {HGT / 2})">{esc(ylab)}</text>',
            f'<text x="{PAD - 3}" y="26" class="tk" text-anchor="end">{fmt(yr[1], 2)}</text>',
            f'<text x="{PAD - 3}" y="{HGT - PAD}" class="tk" text-anchor="end">{fmt(yr[0], 2)}</text>',
            f'<text x="{PAD}" y="{HGT - PAD + 12}" class="tk">{fmt(xr[0], 2)}</text>',
            f'<text x="{W - 8}" y="{HGT - PAD + 12}" class="tk" text-anchor="end">{fmt(xr[1], 2)}</text>']


def _svg(body: List[str], cls: str) -> str:
    return f'<svg class="chart {cls}" viewBox="0 0 {W} {HGT}" width="{W}" height="{HGT}">' + "".join(body) + "</svg>"


def chart_adv_by_turn(turns: List[Dict[str, Any]]) -> str:
    """Each traced turn's advantage at its turn index; a bar marks the mean per index."""
    pts = [(t["h"], t["adv"]) for t in turns if t.get("adv") is not None]
    if not pts:
        return _svg([f'<text x="{W / 2}" y="{HGT / 2}" class="ct">no advantages</text>'], "adv-by-turn")
    hmax = max(h for h, _ in pts)
    ys = [a for _, a in pts]
    yr = (min(min(ys), 0.0), max(max(ys), 0.0))
    sx, sy = _scale(-0.5, hmax + 0.5, PAD, W - 8), _scale(yr[0], yr[1], HGT - PAD, 22)
    body = _axes("advantage by turn index", "turn index h", "A_h", (0, hmax), yr)
    body.append(f'<line x1="{PAD}" y1="{sy(0):.1f}" x2="{W - 8}" y2="{sy(0):.1f}" class="zero"/>')
    for h in range(hmax + 1):
        at = [a for hh, a in pts if hh == h]
        if at:
            m = sum(at) / len(at)
            body.append(f'<line x1="{sx(h) - 12:.1f}" y1="{sy(m):.1f}" x2="{sx(h) + 12:.1f}" y2="{sy(m):.1f}" '
                        f'class="mean"><title>turn {h}: mean {fmt(m)} over {len(at)}</title></line>')
    for i, (h, a) in enumerate(pts):
        jitter = ((i * 37) % 11 - 5) * 1.2
        body.append(f'<circle cx="{sx(h) + jitter:.1f}" cy="{sy(a):.1f}" r="2.6" class="pt">'
                    f'<title>turn {h}: {fmt(a)}</title></circle>')
    return _svg(body, "adv-by-turn")


def chart_value_return(turns: List[Dict[str, Any]]) -> Tuple[str, Optional[float]]:
    """The critic's value at each turn start against the turn's return; the diagonal is a perfect critic."""
    pairs = [(t["value"], t["return"]) for t in turns if t.get("value") is not None and t.get("return") is not None]
    ev = explained_variance(pairs)
    if not pairs:
        return _svg([f'<text x="{W / 2}" y="{HGT / 2}" class="ct">no critic in this run</text>'], "value-return"), None
    allv = [x for p in pairs for x in p]
    lo, hi = min(allv), max(allv)
    sx, sy = _scale(lo, hi, PAD, W - 8), _scale(lo, hi, HGT - PAD, 22)
    body = _axes(f"value vs return (EV {fmt(ev)})", "return", "value V(s_h)", (lo, hi), (lo, hi))
    body.append(f'<line x1="{sx(lo):.1f}" y1="{sy(lo):.1f}" x2="{sx(hi):.1f}" y2="{sy(hi):.1f}" class="diag"/>')
    for v, r in pairs:
        body.append(f'<circle cx="{sx(r):.1f}" cy="{sy(v):.1f}" r="2.6" class="pt">'
                    f'<title>V {fmt(v)}, return {fmt(r)}</title></circle>')
    return _svg(body, "value-return"), ev


def chart_clip_by_length(turns: List[Dict[str, Any]], bins: int = 6) -> str:
    """The mean clipped share of the turns in each length bin (bar) and how many turns it holds."""
    pts = [(t["n_tokens"], t["clipped"] + (t.get("dual") or 0)) for t in turns if t.get("clipped") is not None]
    if not pts:
        return _svg([f'<text x="{W / 2}" y="{HGT / 2}" class="ct">no update statistics</text>'], "clip-by-len")
    lo, hi = min(n for n, _ in pts), max(n for n, _ in pts)
    width = max(1, math.ceil((hi - lo + 1) / bins))
    edges = list(range(lo, hi + 1, width))
    sx = _scale(0, len(edges), PAD, W - 8)
    sy = _scale(0, 1, HGT - PAD, 22)
    body = _axes("clipped share by turn length", "turn length (tokens)", "clipped share", (lo, hi), (0, 1))
    for i, e in enumerate(edges):
        inbin = [c for n, c in pts if e <= n < e + width]
        if not inbin:
            continue
        m = sum(inbin) / len(inbin)
        x0, x1 = sx(i) + 2, sx(i + 1) - 2
        body.append(f'<rect x="{x0:.1f}" y="{sy(m):.1f}" width="{x1 - x0:.1f}" height="{sy(0) - sy(m):.1f}" '
                    f'class="bar"><title>{e}-{e + width - 1} tokens: {fmt(m)} clipped, {len(inbin)} turns'
                    f'</title></rect>')
    return _svg(body, "clip-by-len")


# ------------------------------------------------------------------------------------------------ views
def token_spans(t: Dict[str, Any]) -> str:
    """The response's tokens, each with its advantage (``data-a``) and log-ratio (``data-r``) for the colouring."""
    advs = t.get("tok_adv") or [t.get("adv")] * len(t["tokens"])
    lrs = t.get("tok_log_ratio") or [None] * len(t["tokens"])
    out = []
    for tok, a, r in zip(t["tokens"], advs, lrs):
        tip = f"A {fmt(a)} | ratio {fmt(ratio(r))}"
        out.append(f'<span class="tok" data-a="{attr(a)}" data-r="{attr(r)}" title="{esc(tip)}">{esc(tok)}</span>')
    return "".join(out)


TURN_COLS = ("h", "observation", "response", "reward", "flags", "value", "return", "adv", "ratio", "clipped",
             "dual", "live", "token band")


_TEMPLATE = re.compile(r"<\|im_(?:start|end)\|>(?:assistant|user|system)?")


def obs_tail(obs: str, chars: int = 60) -> str:
    """The end of an observation without the chat template's tokens (the summary of its cell)."""
    return _TEMPLATE.sub(" ", obs).strip()[-chars:] or "(none)"


def turn_row(ep_key: str, t: Dict[str, Any]) -> str:
    clipped = turn_clipped(t)
    flags = []
    if t.get("format_ok") is False:
        flags.append("format")
    if t.get("invalid"):
        flags.append(f"invalid×{t['invalid']}")
    if t.get("capped"):
        flags.append("capped")
    mark = '<span class="badge clip">CLIPPED</span>' if clipped else ""
    think = f'<div class="think">think: {esc(t["think"])}</div>' if t.get("think") else ""
    answer = f'<div class="answer">answer: {esc(t["answer"])}</div>' if t.get("answer") else ""
    data = " ".join(f'data-{k}="{attr(t.get(k))}"' for k in ("h", "reward", "value", "return", "adv", "log_ratio",
                                                               "clipped", "dual", "live", "token_band",
                                                               "n_tokens"))
    cells = [f'<td class="num">{t["h"]}{mark}</td>',
             f'<td class="obs"><details><summary>{esc(obs_tail(t["obs"]))}</summary>'
             f'<pre>{esc(t["obs"])}</pre></details></td>',
             f'<td class="resp"><div class="toks">{token_spans(t)}</div>{think}{answer}</td>',
             f'<td class="num">{fmt(t.get("reward"))}</td>',
             f'<td class="flags">{esc(" ".join(flags))}</td>',
             f'<td class="num">{fmt(t.get("value"))}</td>', f'<td class="num">{fmt(t.get("return"))}</td>',
             f'<td class="num">{fmt(t.get("adv"))}</td>', f'<td class="num">{fmt(ratio(t.get("log_ratio")))}</td>',
             f'<td class="num">{fmt(t.get("clipped"))}</td>', f'<td class="num">{fmt(t.get("dual"))}</td>',
             f'<td class="num">{fmt(t.get("live"))}</td>',
             f'<td class="num">{fmt(t.get("token_band"))}</td>']
    cls = "turn clipped" if clipped else "turn"
    return f'<tr class="{cls}" data-ep="{esc(ep_key)}" {data}>' + "".join(cells) + "</tr>"


def episode_view(step: int, ep: Dict[str, Any], anchor: str) -> str:
    n_clip = sum(turn_clipped(t) for t in ep["turns"])
    head = (f'<b>{esc(ep["key"])}</b> · group {ep["group_id"]} · reward {fmt(ep["reward"])} · '
            f'{"success" if ep["success"] else "no success"}{" · truncated" if ep["truncated"] else ""} · '
            f'{len(ep["turns"])} turns · {n_clip} clipped'
            + (f' · clip-bias scale {fmt(ep["clip_bias_scale"])}' if ep.get("clip_bias_scale") is not None else ""))
    rows = "".join(turn_row(ep["key"], t) for t in ep["turns"])
    return (f'<details class="episode" id="{esc(anchor)}" data-key="{esc(ep["key"])}" open><summary>{head}</summary>'
            f'<table class="turns"><tr>{"".join(f"<th>{c}</th>" for c in TURN_COLS)}</tr>{rows}</table></details>')


def adv_chip(t: Dict[str, Any]) -> str:
    cls = "chip clipped" if turn_clipped(t) else "chip"
    return (f'<span class="{cls}" data-a="{attr(t.get("adv"))}" title="turn {t["h"]}: A {fmt(t.get("adv"))}, '
            f'ratio {fmt(ratio(t.get("log_ratio")))}">{fmt(t.get("adv"), 2)}</span>')


def group_view(step: int, eps: List[Dict[str, Any]], anchors: Dict[str, str]) -> str:
    groups: Dict[int, List[Dict[str, Any]]] = {}
    for ep in eps:
        groups.setdefault(ep["group_id"], []).append(ep)
    out = []
    for g, members in groups.items():
        cols = "".join(
            f'<td><a href="#{esc(anchors[e["key"]])}">{esc(e["key"])}</a><br>score <b>{fmt(e["reward"])}</b>'
            f'{" ✓" if e["success"] else ""}<div class="chips">{"".join(adv_chip(t) for t in e["turns"])}</div></td>'
            for e in members)
        out.append(f'<table class="group" data-group="{g}"><tr><th>group {g} '
                   f'({len(members)} episodes, seed {members[0]["env_seed"]})</th>{cols}</tr></table>')
    return "".join(out)


def step_view(line: Dict[str, Any]) -> str:
    turns = [t for ep in line["episodes"] for t in ep["turns"]]
    vr, ev = chart_value_return(turns)
    clipped = [turn_clipped(t) for t in turns if t.get("clipped") is not None]
    shown = f"{sum(clipped)} of {len(clipped)}" if clipped else "– (no update read)"
    stats = (f'{len(line["episodes"])} episodes, {len(turns)} turns; turns clipped (PPO or dual): {shown}; '
             f'explained variance (turn starts) {fmt(ev)}; update statistics read at: '
             f'{esc(line.get("update", {}).get("when"))}')
    return (f'<div class="stepstats" data-ev="{attr(ev)}">{stats}</div><div class="charts">'
            f'{chart_adv_by_turn(turns)}{vr}{chart_clip_by_length(turns)}</div>')


def compare_turn_cells(t: Optional[Dict[str, Any]]) -> str:
    if t is None:
        return '<td colspan="4" class="none">–</td>'
    mark = " clipped" if turn_clipped(t) else ""
    gone = None if t.get("clipped") is None else t["clipped"] + (t.get("dual") or 0.0)
    return (f'<td class="resp{mark}"><div class="toks">{token_spans(t)}</div></td><td class="num">{fmt(t.get("adv"))}'
            f'</td><td class="num">{fmt(ratio(t.get("log_ratio")))}</td><td class="num{mark}">{fmt(gone)}</td>')


def compare_view(line_a: Dict[str, Any], line_b: Optional[Dict[str, Any]], names: Tuple[str, str]) -> str:
    if line_b is None:
        return f'<p class="none">{esc(names[1])} has no trace at this step.</p>'
    by_key = {e["key"]: e for e in line_b["episodes"]}
    both = [(e, by_key[e["key"]]) for e in line_a["episodes"] if e["key"] in by_key]
    if not both:
        return '<p class="none">no episode traced in both runs at this step (same env seed and place in group)</p>'
    out = []
    head = "<th>h</th>" + "".join(f'<th>{esc(n)}: response</th><th>A</th><th>ratio</th><th>clipped + dual</th>'
                                  for n in names)
    for a, b in both:
        same = [ta["tokens"] for ta in a["turns"]] == [tb["tokens"] for tb in b["turns"]]
        rows = []
        for h in range(max(len(a["turns"]), len(b["turns"]))):
            ta = a["turns"][h] if h < len(a["turns"]) else None
            tb = b["turns"][h] if h < len(b["turns"]) else None
            rows.append(f'<tr class="cmp" data-key="{esc(a["key"])}" data-h="{h}" '
                        f'data-adv-a="{attr(ta and ta.get("adv"))}" data-adv-b="{attr(tb and tb.get("adv"))}">'
                        f'<td class="num">{h}</td>{compare_turn_cells(ta)}{compare_turn_cells(tb)}</tr>')
        note = "same responses in both runs" if same else "responses differ"
        out.append(f'<div class="cmpep"><b>{esc(a["key"])}</b> · scores {fmt(a["reward"])} / {fmt(b["reward"])} · '
                   f'{note}<table class="turns">{"<tr>" + head + "</tr>"}{"".join(rows)}</table></div>')
    return "".join(out)


# ------------------------------------------------------------------------------------------------ the page
CSS = """
[hidden]{display:none!important}
body{font:13px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{position:sticky;top:0;background:#fff;border-bottom:1px solid #ccc;padding:6px 12px;z-index:2}
header h1{font-size:16px;margin:0 0 4px}
.nav button,.nav select{font-size:13px;margin-right:4px}
main{padding:8px 12px}
h2{font-size:14px;margin:14px 0 6px;border-bottom:1px solid #ddd}
.charts{display:flex;flex-wrap:wrap;gap:10px}
.chart{background:#fff;border:1px solid #ddd}
.ct{font-size:11px;text-anchor:middle;font-weight:600}.cl{font-size:10px;text-anchor:middle;fill:#555}
.tk{font-size:9px;fill:#777}.ax{stroke:#888}.zero,.diag{stroke:#bbb;stroke-dasharray:3 3}
.pt{fill:#3366aa;fill-opacity:.7}.mean{stroke:#d33;stroke-width:2}.bar{fill:#e08a2c}
table.turns{border-collapse:collapse;width:100%;background:#fff;margin:4px 0}
table.turns td,table.turns th{border:1px solid #ddd;padding:2px 4px;vertical-align:top}
th{background:#f0f0f0;font-weight:600;text-align:left}
td.num{text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}
td.obs{max-width:220px}td.obs pre{white-space:pre-wrap;font-size:11px;max-height:240px;overflow:auto}
td.resp{max-width:520px}.toks{font-family:ui-monospace,monospace;font-size:12px;white-space:pre-wrap;word-break:break-all}
.tok{border-radius:2px}.think,.answer{font-size:11px;color:#555}
tr.clipped>td:first-child{border-left:4px solid #d00}.badge.clip{background:#d00;color:#fff;font-size:9px;
padding:0 3px;margin-left:3px;border-radius:3px}td.clipped{outline:2px solid #d00}
.episode{margin:6px 0;background:#fff;border:1px solid #ccc;padding:2px 6px}
table.group{border-collapse:collapse;margin:4px 0;background:#fff}
table.group td,table.group th{border:1px solid #ddd;padding:3px 6px;vertical-align:top}
.chip{display:inline-block;min-width:28px;text-align:center;margin:1px;border:1px solid #ccc;border-radius:3px;
font-size:11px}.chip.clipped{border:2px solid #d00}
.legend{display:inline-flex;align-items:center;gap:4px;margin-left:12px;font-size:11px}
.legend .bar{width:160px;height:10px;border:1px solid #aaa}
.none{color:#888}#errors{color:#b00;white-space:pre-wrap}.stepstats{margin:4px 0;color:#333}
"""

JS = r"""
(function(){
  var errs=document.getElementById('errors');
  function report(m){errs.textContent+=m+'\n';errs.hidden=false;}
  window.addEventListener('error',function(e){report('error: '+e.message);});
  var ce=console.error;console.error=function(){report('console.error: '+Array.prototype.join.call(arguments,' '));
    if(ce)ce.apply(console,arguments);};
  var meta=JSON.parse(document.getElementById('meta').textContent);
  var sections=Array.prototype.slice.call(document.querySelectorAll('section.step'));
  var sel=document.getElementById('step');
  var mode='adv';
  function colour(x,scale){
    if(x===null||x===undefined||!isFinite(x))return '';
    var v=Math.max(-1,Math.min(1,x/scale));var a=Math.abs(v);
    return v>=0?'rgba(220,40,40,'+(0.85*a).toFixed(3)+')':'rgba(40,90,220,'+(0.85*a).toFixed(3)+')';
  }
  function paint(sec){
    var toks=sec.querySelectorAll('.tok,.chip');
    for(var i=0;i<toks.length;i++){
      var el=toks[i];var key=(mode==='adv'||el.classList.contains('chip'))?'a':'r';
      var x=JSON.parse(el.getAttribute('data-'+key));
      el.style.background=key==='a'?colour(x,meta.adv_scale):colour(x,meta.ratio_scale);
    }
  }
  function show(i){
    i=Math.max(0,Math.min(sections.length-1,i));
    for(var j=0;j<sections.length;j++){sections[j].hidden=j!==i;}
    sel.value=String(i);paint(sections[i]);
    document.getElementById('legend-adv').hidden=mode!=='adv';
    document.getElementById('legend-ratio').hidden=mode==='adv';
  }
  sel.addEventListener('change',function(){show(+sel.value);});
  document.getElementById('prev').addEventListener('click',function(){show(+sel.value-1);});
  document.getElementById('next').addEventListener('click',function(){show(+sel.value+1);});
  document.addEventListener('keydown',function(e){
    if(e.target.tagName==='SELECT')return;
    if(e.key==='ArrowLeft')show(+sel.value-1);if(e.key==='ArrowRight')show(+sel.value+1);});
  var radios=document.querySelectorAll('input[name=mode]');
  for(var k=0;k<radios.length;k++){radios[k].addEventListener('change',function(e){mode=e.target.value;
    show(+sel.value);});}
  show(meta.initial);
  document.body.setAttribute('data-ready','1');
})();
"""


def _legend(scale: float, ratio_scale: float) -> str:
    grad = "linear-gradient(90deg,rgba(40,90,220,.85),#fff,rgba(220,40,40,.85))"
    lo, hi = math.exp(-ratio_scale), math.exp(ratio_scale)
    return (f'<span class="legend" id="legend-adv">advantage {fmt(-scale, 2)}<span class="bar" '
            f'style="background:{grad}"></span>{fmt(scale, 2)}</span>'
            f'<span class="legend" id="legend-ratio" hidden>ratio {fmt(lo, 3)}<span class="bar" '
            f'style="background:{grad}"></span>{fmt(hi, 3)} (token ratio, log scale)</span>')


def adv_scale(lines: Sequence[Dict[str, Any]]) -> float:
    """The colour scale of advantages: the 95th percentile of |A| over the recorded tokens (at least 1e-6)."""
    xs = sorted(abs(a) for line in lines for ep in line["episodes"] for t in ep["turns"]
                for a in (t.get("tok_adv") or [t.get("adv")]) if a is not None)
    return max(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1e-6) if xs else 1.0


def run_name(run: Path) -> str:
    return Path(run).resolve().name


def build_page(run: str | Path, step: Optional[int] = None, compare: str | Path | None = None,
               out: str | Path | None = None) -> Path:
    """Write the page of ``run``'s trace (and ``compare``'s, side by side) and return its path (default
    ``<run>/inspect.html``). ``step``: the step shown first (default the last traced)."""
    run = Path(run)
    lines = read_trace(run / TRACE_FILE)
    if not lines:
        raise FileNotFoundError(f"{run / TRACE_FILE}: no trace (train with trainer.trace_episodes > 0, the default)")
    steps = [int(x["step"]) for x in lines]
    if step is not None and step not in steps:
        raise ValueError(f"--step {step}: not traced; traced steps: {steps[0]}..{steps[-1]} ({len(steps)})")
    other: Dict[int, Dict[str, Any]] = {}
    names = (run_name(run), run_name(Path(compare)) if compare else "")
    if compare is not None:
        cl = read_trace(Path(compare) / TRACE_FILE)
        if not cl:
            raise FileNotFoundError(f"{Path(compare) / TRACE_FILE}: no trace to compare with")
        other = {int(x["step"]): x for x in cl}
    initial = steps.index(step) if step is not None else len(steps) - 1
    algo = lines[-1].get("algo", {})
    high = float(algo.get("clip_ratio_high") or 0.28)
    meta = {"initial": initial, "adv_scale": adv_scale(lines), "ratio_scale": math.log1p(high)}
    options = "".join(f'<option value="{i}">step {s}</option>' for i, s in enumerate(steps))
    sections = []
    for i, line in enumerate(lines):
        s = int(line["step"])
        anchors = {ep["key"]: f"s{s}-{ep['key']}" for ep in line["episodes"]}
        parts = [f'<h2>Step {s}: the step view</h2>{step_view(line)}',
                 f'<h2>Groups (G episodes of one prompt)</h2>{group_view(s, line["episodes"], anchors)}']
        if compare is not None:
            parts.append(f'<h2>{esc(names[0])} vs {esc(names[1])}: the same episodes\' credit</h2>'
                         f'{compare_view(line, other.get(s), names)}')
        parts.append("<h2>Episodes</h2>" + "".join(episode_view(s, ep, anchors[ep["key"]])
                                                   for ep in line["episodes"]))
        hidden = "" if i == initial else " hidden"
        sections.append(f'<section class="step" data-step="{s}"{hidden}>{"".join(parts)}</section>')
    desc = (f'{esc(algo.get("adv_estimator"))} + {esc(algo.get("policy_loss"))} (critic: '
            f'{esc(algo.get("critic_level"))}), {esc(lines[-1].get("engine"))} engine, '
            f'{len(steps)} traced steps')
    title = f"{names[0]}" + (f" vs {names[1]}" if compare else "")
    page = (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{esc(title)}: credit</title>'
            f'<style>{CSS}</style></head><body><header><h1>{esc(title)}</h1><div>{desc}</div>'
            f'<div class="nav"><button id="prev">&#9664;</button><select id="step">{options}</select>'
            f'<button id="next">&#9654;</button> colour tokens by <label><input type="radio" name="mode" '
            f'value="adv" checked>advantage</label><label><input type="radio" name="mode" value="ratio">ratio'
            f'</label>{_legend(meta["adv_scale"], meta["ratio_scale"])}</div><pre id="errors" hidden></pre>'
            f'</header><main>{"".join(sections)}</main>'
            f'<script type="application/json" id="meta">{json.dumps(meta)}</script><script>{JS}</script>'
            f'</body></html>')
    out = Path(out) if out is not None else run / PAGE_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page, encoding="utf-8")
    return out


def has_trace(run: str | Path) -> bool:
    return (Path(run) / TRACE_FILE).is_file()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ragen_turn.inspect", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a run directory (holding trace.jsonl)")
    p.add_argument("--step", type=int, default=None, help="the step shown first (default: the last traced)")
    p.add_argument("--compare", default=None, help="a second run: the same episodes' credit side by side")
    p.add_argument("--out", default=None, help=f"the HTML file (default: <run>/{PAGE_FILE})")
    a = p.parse_args(argv)
    for r in filter(None, (a.run, a.compare)):
        if not (Path(r) / CONFIG_FILE).is_file() and not has_trace(r):
            print(f"error: {r}: not a run directory (no {CONFIG_FILE} or {TRACE_FILE})", file=sys.stderr)
            return 2
    try:
        path = build_page(a.run, a.step, a.compare, a.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
