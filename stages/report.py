"""One self-contained HTML page from metrics/ and plots/: reports/index.html (images embedded).

    python -m stages.report [--output FILE]

Sections appear for what exists: the STS table (metrics/sts.json), training curves (metrics/curves/*.csv),
the collapse plot and every analysis that has been run (metrics/analysis/, plots/).
"""

from __future__ import annotations

import argparse
import base64
import csv
import html
import io
import json
import subprocess
from pathlib import Path
from typing import Any

from sentcl.evaluation import TASKS
from stages.common import METRICS, PLOTS, REPORTS, ROOT, load_params

TEMPLATES = Path(__file__).resolve().parent / "templates"

ANALYSIS = METRICS / "analysis"
STYLE = """
body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;line-height:1.45}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #ddd;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.8em 0;font-size:.92em} th,td{border:1px solid #ccc;padding:.3em .6em;text-align:right}
th:first-child,td:first-child{text-align:left} th{background:#f4f4f4} td.best{font-weight:bold;background:#eef7ee}
.note{color:#555;font-size:.92em} img{max-width:100%;border:1px solid #eee;margin:.5em 0}
.missing{color:#a33}
table.facts th{text-align:left;vertical-align:top;white-space:nowrap} table.facts td{text-align:left}
table.facts ul{margin:.2em 0;padding-left:1.2em}
.verdict{font-size:1.15em;padding:.5em .8em;border-left:5px solid #888;background:#f6f6f6}
.verdict.good{border-color:#2a7;background:#eef7ee} .verdict.kept{border-color:#c80;background:#fbf5e8}
"""

# Which analyses to show, and what each plot says.
ANALYSES = [
    (
        "collapse",
        "Cosine similarity by gold score (collapse)",
        "Each box is the distribution of cosine similarities of STS-B test pairs whose human score falls in the "
        "bucket. A collapsed space (ConSERT Figure 1) gives high cosines to every pair, so boxes overlap; a good "
        "space rises with the gold score. Run: <code>make analysis-space</code>.",
    ),
    (
        "align_uniform",
        "Alignment and uniformity",
        "Wang and Isola's measures on STS-B test: alignment is the mean squared distance of positive pairs "
        "(gold &gt; 4), uniformity the log mean Gaussian potential over all sentences; lower is better for both.",
    ),
    (
        "freq_tokens",
        "Frequent-token removal",
        "Spearman when the k most frequent tokens ([CLS]/[SEP] included) are left out of mean pooling. "
        "Run: <code>make analysis-freq-tokens</code>.",
    ),
    (
        "aug_grid",
        "Augmentation pairs",
        "STS-B test Spearman after a short unsupervised transfer with each pair "
        "of views. Run: <code>make analysis-aug-grid</code>.",
    ),
    ("few_shot", "Few-shot transfer", "STS-B Spearman against the number of target texts used for transfer."),
    ("temperature", "Temperature", "STS-B Spearman against the contrastive temperature."),
    ("batch_size", "Batch size", "STS-B Spearman against the transfer batch size."),
]


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


def _fig_html(fig) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    return f'<img alt="figure" src="data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}">'


def sts_table(sts: dict[str, Any], protocol: str) -> str:
    columns = [*TASKS, "avg"]
    best = {
        c: max((row[protocol].get(c, float("-inf")) for row in sts.values()), default=None) for c in columns
    }
    head = "<tr><th>Checkpoint</th>" + "".join(f"<th>{'Avg.' if c == 'avg' else c}</th>" for c in columns)
    head += "<th>STS-B dev</th></tr>"
    rows = []
    for name, row in sts.items():
        cells = []
        for c in columns:
            value = row[protocol].get(c)
            cls = ' class="best"' if value is not None and len(sts) > 1 and value == best[c] else ""
            cells.append(f"<td{cls}>{value:.2f}</td>" if value is not None else "<td>-</td>")
        dev = row.get("stsb_dev")
        rows.append(
            f"<tr><td>{html.escape(name)}</td>{''.join(cells)}<td>{dev:.2f}</td></tr>"
            if dev is not None
            else f"<tr><td>{html.escape(name)}</td>{''.join(cells)}<td>-</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def curves_section(curves_dir: Path) -> str:
    files = sorted(curves_dir.glob("*.csv")) if curves_dir.is_dir() else []
    if not files:
        return '<p class="missing">No training curves yet (metrics/curves/*.csv come from the training stages).</p>'
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (loss_ax, dev_ax) = plt.subplots(1, 2, figsize=(12, 4.2))
    for path in files:
        rows = _read_csv(path)

        def series(column: str, rows=rows) -> tuple[list[float], list[float]]:
            points = [
                (float(r["step"]), float(r[column])) for r in rows if r.get(column) not in (None, "", "nan")
            ]
            return [p[0] for p in points], [p[1] for p in points]

        loss_ax.plot(*series("loss"), label=path.stem, linewidth=1.2)
        dev_ax.plot(*series("stsb_dev"), marker="o", label=path.stem)
    loss_ax.set(title="Training loss by step", xlabel="optimizer step (count)", ylabel="loss (nats)")
    dev_ax.set(title="STS-B dev Spearman by step", xlabel="optimizer step (count)", ylabel="Spearman x 100")
    for ax in (loss_ax, dev_ax):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    out = _fig_html(fig)
    plt.close(fig)
    return out


def _csv_table(path: Path, limit: int = 60) -> str:
    rows = _read_csv(path)
    if not rows:
        return ""
    head = "".join(f"<th>{html.escape(k)}</th>" for k in rows[0])

    def fmt(v: str) -> str:
        try:
            return f"{float(v):.2f}" if "." in v else v
        except ValueError:
            return html.escape(v)

    body = "".join("<tr>" + "".join(f"<td>{fmt(v)}</td>" for v in r.values()) + "</tr>" for r in rows[:limit])
    more = (
        f'<p class="note">{len(rows) - limit} more rows in {path.relative_to(ROOT)}</p>'
        if len(rows) > limit
        else ""
    )
    return f"<details><summary>Table ({path.relative_to(ROOT)})</summary><table><tr>{head}</tr>{body}</table>{more}</details>"


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def _lr(params: dict[str, Any], checkpoint: str) -> Any:
    """The learning rate a checkpoint trained with, as params.yaml resolves it (recipe, stage section, train)."""
    section, recipe = {"nli": ("pretrain_nli", None), "joint": ("joint", None)}.get(
        checkpoint, ("transfer", checkpoint.removeprefix("transfer-"))
    )
    stage = params.get(section) or {}
    own = (stage.get(recipe) or {}) if recipe else {}
    return own.get("lr", stage.get("lr", (params.get("train") or {}).get("lr")))


def shipped_facts(metrics: Path, params: dict[str, Any]) -> dict[str, Any]:
    """What the first screen says: the exported checkpoint, the registry version and gate, validation, settings."""
    export, registry = _json(metrics / "export.json"), _json(metrics / "registry.json")
    if not export:
        return {"checkpoint": None}
    name = export["checkpoint"]
    sts = _json(metrics / "sts.json") or {}
    facts: dict[str, Any] = {
        "checkpoint": name,
        "stsb_dev": f"{export['stsb_dev']:.2f}",
        "avg": f"{sts[name]['all']['avg']:.2f}" if name in sts else "?",
        "base_avg": f"{sts['base']['all']['avg']:.2f}" if "base" in sts and name != "base" else None,
        "beat_init": "trained past its init"
        if export.get("trained_beat_init")
        else "no training beat the base",
        "onnx": f"exported and checked against PyTorch (largest difference {export['onnx_max_abs_diff']:.1e})"
        if export.get("onnx_max_abs_diff") is not None
        else "not exported (the model is served by PyTorch)",
    }
    gate = (registry or {}).get("gate") or {}
    version, model = (registry or {}).get("registered_version"), (registry or {}).get("registered_model")
    if not registry:
        facts["registry"] = "not registered yet: the register stage has not run in this clone (make register)"
    elif version is None:
        facts["registry"] = "not registered: tracking was off (SENTCL_MLFLOW=0)"
    else:
        new = "a new version" if registry.get("new_version") else "the same weights as an existing version"
        facts["registry"] = (
            f"version {version} of {model} ({new}); champion: version {gate.get('champion_after') or '-'}"
        )
    decision = gate.get("decision")
    facts["gate_decision"] = {
        "promoted": f"promoted: version {version} is champion",
        "rejected": f"rejected: version {gate.get('champion_after') or '-'} stays champion",
        "unchanged": f"version {version} was already champion",
    }.get(decision, "not run")
    facts["gate_reasons"] = gate.get("reasons") or []
    if decision == "promoted" or (decision == "unchanged" and version is not None):
        facts["verdict"], facts["verdict_class"] = (
            f"{name} shipped: champion is version {version} of {model}.",
            "good",
        )
    elif decision == "rejected":
        facts["verdict"] = (
            f"{name} was registered as version {version}; the gate kept version {gate.get('champion_after')}."
        )
        facts["verdict_class"] = "kept"
    else:
        facts["verdict"], facts["verdict_class"] = (
            f"{name} was exported to models/export; nothing is registered.",
            "",
        )
    validate = _json(metrics / "validate.json")
    facts["validation"] = (
        "not run"
        if validate is None
        else f"passed: {validate['pairs']:,} pairs, no violation"
        if validate.get("violations") == 0
        else f"FAILED: {validate.get('violations')} violations (reports/validation.json)"
    )
    record = _json(metrics / "train" / f"{name}.json")
    if name == "base" or record is None:
        facts["training"] = "none: the pretrained model itself (no trained checkpoint beat it on STS-B dev)"
    else:
        bf16 = (params.get("train") or {}).get("bf16")
        precision = record.get("precision") or f"not recorded (train.bf16: {bf16})"
        facts["training"] = (
            f"{record.get('steps')} steps, selected step {record.get('best_step')} "
            f"(STS-B dev {record.get('stsb_dev_step0')} -> {record.get('stsb_dev_best')}); "
            f"lr {_lr(params, name)}; precision {precision}; {record.get('examples'):,} examples"
        )
    return facts


def render(metrics: Path = METRICS, plots: Path = PLOTS, params: dict[str, Any] | None = None) -> str:
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    analysis = metrics / "analysis"
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    params = params if params is not None else load_params()
    parts = ["<h2>STS benchmark by checkpoint</h2>"]
    sts_path = metrics / "sts.json"
    if sts_path.exists():
        sts = json.loads(sts_path.read_text())
        pooling = next(iter(sts.values())).get("pooling", "?") if sts else "?"
        parts += [
            f"<p>Seven tasks as in ConSERT's Table 3 (pooling <code>{html.escape(pooling)}</code>). "
            '<b>Protocol "all"</b>: the subsets of each STS12-16 task are concatenated and one Spearman is '
            "computed (ConSERT, SimCSE and MTEB report this). The best value of each column is highlighted. "
            "STS-B dev is the split used for checkpoint selection, never part of the average.</p>",
            sts_table(sts, "all"),
            '<p><b>Protocol "mean"</b>: the average of per-subset Spearman (SentEval\'s default); STS-B and '
            "SICK-R have one subset, so they match the table above.</p>",
            sts_table(sts, "mean"),
            "<p class='note'>Checkpoints: <i>base</i> = the pretrained encoder as the pipeline starts it; "
            "<i>nli</i> = supervised on NLI; <i>joint</i> = NLI + contrastive jointly; <i>transfer-*</i> = "
            "each of those after unsupervised contrastive transfer on the STS sentences (ConSERT's unsup, "
            "sup-unsup and joint-unsup).</p>",
        ]
    else:
        parts.append(
            '<p class="missing">metrics/sts.json is missing: run <code>make run</code> (the evaluate stage).</p>'
        )
    parts += [
        "<h2>Training curves</h2>",
        "<p>Left: the training loss of each stage. Right: STS-B dev Spearman at each evaluation; each stage "
        "keeps its best evaluation (step 0 is the model it started from).</p>",
        curves_section(metrics / "curves"),
    ]
    for stem, title, text in ANALYSES:
        png, table = plots / f"{stem}.png", analysis / f"{stem}.csv"
        if stem == "collapse" or png.exists():
            parts.append(f"<h2>{html.escape(title)}</h2><p>{text}</p>")
        if png.exists():
            parts.append(_img(png))
            if table.exists():
                parts.append(_csv_table(table))
        elif stem == "collapse":
            parts.append('<p class="missing">Not run yet: <code>make analysis-space</code>.</p>')
    summary = analysis / "freq_tokens.json"
    if summary.exists():
        s = json.loads(summary.read_text())
        parts.append(
            f"<p>Frequent tokens, {html.escape(Path(s['model']).name)}: avg {s['k0_avg']:.2f} with nothing "
            f"removed, best {s['best_avg']:.2f} at k = {s['best_k']}.</p>"
        )
    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    return env.get_template("report.html.j2").render(
        style=STYLE,
        commit=commit.strip() or "?",
        shipped=shipped_facts(metrics, params),
        body="\n".join(parts),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--output", type=Path, default=REPORTS / "index.html")
    args = parser.parse_args(argv)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(render())
    print(f"report: {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
