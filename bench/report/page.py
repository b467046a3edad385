"""index.html, one file that travels alone: the verdict per setting, a table of contents, every section with its
plots embedded as PNG data URIs, the definitions last; method names link to the project's docs on each method."""
from __future__ import annotations

import base64
import html
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from bench.artifacts import PROJECT_ROOT

METHODS_TABLE = ("README.md", "Methods")  # the README's table of every method: what it drafts, what it needs
TRAINED_HEADS = ("docs/methods.md", "Trained-head methods: Medusa, EAGLE, EAGLE-2, Hydra")
METHOD_DOCS = {  # method -> (file, heading): its own section of docs/methods.md, else the README's table
    **dict.fromkeys(["vanilla", "pld", "lookahead", "rest", "sps", "recycling", "samd", "eagle3"], METHODS_TABLE),
    **dict.fromkeys(["medusa", "eagle", "eagle2", "hydra"], TRAINED_HEADS),
    "suffix": ("docs/methods.md", "SuffixDecoding (`method=suffix`)"),
    "mlp_speculator": ("docs/methods.md", "MLPSpeculator (IBM)"),
    "pard": ("docs/methods.md", "PARD (AMD)"),
    "dflash": ("docs/methods.md", "DFlash (block diffusion drafter)"),
    "redrafter": ("docs/methods.md", "ReDrafter (Apple's Recurrent Drafter)"),
}

STYLE = ("body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse;margin:1em 0}"
         "td,th{border:1px solid #bbb;padding:4px 8px;text-align:right}td{white-space:nowrap}"
         "td:first-child,th:first-child{text-align:left}.facts,.note{color:#444;font-size:90%}.warn{color:#a00}figure{display:inline-block;"
         "margin:0.5em;max-width:100%;vertical-align:top}img{max-width:100%;height:auto}"
         ".verdict{font-size:110%;background:#f3f7ee;border-left:4px solid #5a5;padding:0.5em 1em 0.5em 2em}"
         "nav ol{columns:2;font-size:90%}figcaption{font-size:85%;color:#444}")


@dataclass
class Section:
    """One part of the page: its anchor, heading and HTML body."""

    id: str
    title: str
    body: str


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def section_id(title: str) -> str:
    """An HTML id for a section's title."""
    return re.sub(r"[^a-z0-9_.]+", "-", title.lower()).strip("-")


def method_links(methods, out: Path) -> dict[str, str]:
    """Method label -> link, relative to `out`, to the section of the project's docs on that method (METHOD_DOCS,
    by the label's method name: `pld (num_pred_tokens=5)` and `pld+auto` link as pld); none for a method outside
    METHOD_DOCS or where the docs are not at hand."""
    links = {}
    for method in methods:
        name = re.match(r"\w*", method)[0]
        if name in METHOD_DOCS and (PROJECT_ROOT / METHOD_DOCS[name][0]).exists():
            file, heading = METHOD_DOCS[name]
            relative = Path(os.path.relpath(PROJECT_ROOT / file, out.resolve())).as_posix()
            links[method] = f"{relative}#{anchor(heading)}"
    return links


def html_table(frame: pd.DataFrame, links: dict[str, str] | None = None) -> str:
    """A table of `frame`'s cells; a first-column cell found in `links` links there."""
    links = links or {}
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in frame.columns)
    rows = []
    for row in frame.itertuples(index=False):
        first = html.escape(str(row[0]))
        if str(row[0]) in links:
            first = f"<a href='{html.escape(links[str(row[0])])}'>{first}</a>"
        rows.append(f"<tr><td>{first}</td>" + "".join(f"<td>{html.escape(str(v))}</td>" for v in row[1:]) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def html_figures(out: Path, plots: dict[str, str]) -> str:
    """Each plot ({caption: file in `out`}) embedded as a PNG data URI, captioned with its file's name."""
    return "".join(f"<figure><img src='data:image/png;base64,{base64.b64encode((out / f).read_bytes()).decode()}' "
                   f"alt='{html.escape(k)}'><figcaption>{html.escape(k)} ({html.escape(f)})</figcaption></figure>"
                   for k, f in plots.items())


def html_page(verdicts: list[tuple[Section, str]], sections: list[Section], definitions: dict[str, str],
              cost_notes: str) -> str:
    """index.html: the verdict of each setting (its section and one line), a table of contents, the sections, the
    definitions (term: text) and the cost model's notes."""
    verdict = "".join(f"<li><a href='#{s.id}'>{html.escape(s.title)}</a>: {html.escape(text)}</li>"
                      for s, text in verdicts)
    terms = "".join(f"<li><b>{html.escape(term)}</b>: {html.escape(text)}</li>" for term, text in definitions.items())
    everything = [*sections, Section("definitions", "Definitions",
                                     f"<ul>{terms}</ul><p class='note'>{html.escape(cost_notes)}</p>")]
    contents = "".join(f"<li><a href='#{s.id}'>{html.escape(s.title)}</a></li>" for s in everything)
    body = "".join(f"<section id='{s.id}'><h2>{html.escape(s.title)}</h2>{s.body}</section>" for s in everything)
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Speculative decoding leaderboard</title>"
            f"<style>{STYLE}</style></head><body><h1>Speculative decoding leaderboard</h1>"
            f"<ul class='verdict'>{verdict}</ul><nav><b>Contents</b><ol>{contents}</ol></nav>{body}</body></html>\n")
