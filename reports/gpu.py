"""The GPU report (``reports/gpu/<date>.md``) from the JSON benchmarks/gpu_report.py
writes, and the pieces of it the nightly report's GPU section shows (the latest
such JSON, loaded by harness.night.gpu_report.latest_gpu_report; reports/nightly.py renders it).

Every figure comes from the JSON; nothing here measures or judges anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from reports.figures_page import FIGURES_PAGE, write_figures
from reports.timing_noise import paired_ratio, shown, unpaired_ratio


def __getattr__(name: str) -> Any:
    """``GPU_REPORTS`` and ``latest_gpu_report`` are the harness's (the night loads
    the report without importing reports/); re-exported lazily, so rendering a
    report here does not import the harness."""
    if name in ("GPU_REPORTS", "latest_gpu_report"):
        import harness.night.gpu_report

        return getattr(harness.night.gpu_report, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def section_problem(section: Any) -> str | None:
    """Why a section has no tables (not run, or its error); None when it has them."""
    if section is None:
        return "not run"
    if isinstance(section, dict) and "error" in section:
        return f"failed: {section['error']}"
    return None


def parity_table(report: dict[str, Any]) -> pd.DataFrame:
    rows = report.get("parity", {}).get("rows", [])
    frame = pd.DataFrame(rows, columns=["port", "suite", "level", "items", "bit_exact", "max_ulp", "errors"])
    frame["verdict"] = [
        "BIT-EXACT" if r.bit_exact == r.items and r.errors == 0 else "DIVERGENT" for r in frame.itertuples()
    ]
    return frame


def merge_table(report: dict[str, Any]) -> pd.DataFrame:
    section = report.get("merge", {})
    frame = pd.DataFrame(section.get("rows", []))
    if frame.empty:
        return frame
    copy = section["copy_GBps"]
    return pd.DataFrame(
        {
            "shape (tokens x heads x dim)": frame["shape"],
            "dtype": frame["dtype"],
            "MB moved": (frame["bytes"] / 1e6).round(1),
            "upstream ms": frame["oracle_ms"].round(4),
            "port ms": frame["port_ms"].round(4),
            "upstream GB/s": frame["oracle_GBps"].round(0).astype(int),
            "port GB/s": frame["port_GBps"].round(0).astype(int),
            "port / upstream speed": frame["port_vs_oracle"].round(2),
            "upstream % of copy": (100 * frame["oracle_GBps"] / copy).round(0).astype(int),
            "port % of copy": (100 * frame["port_GBps"] / copy).round(0).astype(int),
            "same bits": frame["bit_identical"].map({True: "yes", False: "NO"}),
            **_noise_columns(
                "port / upstream time",
                [
                    unpaired_ratio(row.get("port_samples") or [], row.get("oracle_samples") or [])
                    for row in section.get("rows", [])
                ],
            ),
        }
    )


def _noise_columns(name: str, ratios: list[Any]) -> dict[str, list[str]]:
    """A ratio with its spread, and its call (reports/timing_noise.py), as two
    columns; none for a report written before samples were kept (it stays as it was)."""
    if all(ratio is None for ratio in ratios):
        return {}
    cells = [shown(ratio) for ratio in ratios]
    return {f"{name} (spread)": [c[0] for c in cells], "call": [c[1] for c in cells]}


def _paired(timings: Any, port: str, upstream: str) -> Any:
    return paired_ratio(timings[port].get("samples") or [], timings[upstream].get("samples") or [])


def prefill_table(report: dict[str, Any]) -> pd.DataFrame:
    frame = pd.DataFrame(report.get("prefill", {}).get("rows", []))
    if frame.empty:
        return frame

    def fastest(side: str) -> list[float]:
        return [round(t[side]["min"], 3) for t in frame["timings"]]

    return pd.DataFrame(
        {
            "batch": frame["batch"],
            "requests": frame["requests"],
            "context tokens": frame["context_tokens"],
            "query tokens": frame["query_tokens"],
            "legacy chunks": frame["legacy_chunks"],
            "per-request chunks": frame["per_request_chunks"],
            "legacy ms": frame["legacy_ms"].round(3),
            "per-request ms": frame["per_request_ms"].round(3),
            "upstream ms": frame["upstream_ms"].round(3),
            "legacy / per-request": frame["speedup"].round(2),
            "legacy min ms": fastest("legacy"),
            "per-request min ms": fastest("per_request"),
            "upstream min ms": fastest("upstream"),
            **_noise_columns(
                "per-request / upstream", [_paired(t, "per_request", "upstream") for t in frame["timings"]]
            ),
        }
    )


def environment_line(report: dict[str, Any]) -> str:
    env = report.get("environment", {})
    return (
        f"{env.get('device', '?')}; torch {env.get('torch', '?')} (CUDA {env.get('cuda', '?')}), "
        f"Triton {env.get('triton', '?')}, Python {env.get('python', '?')}; vLLM {env.get('vllm', '?')} "
        f"imported with {env.get('vllm_platform', '?')} (merge on its Triton branch, compiled for the GPU)"
    )


def _oracle_line(report: dict[str, Any]) -> str:
    oracle = report.get("parity", {}).get("oracle") or {}
    if not oracle:
        return "not opened (the parity section did not run)"
    fingerprints = oracle.get("fingerprints", {})
    ok = sum(status == "ok" for status in fingerprints.values())
    return (
        f"{oracle.get('release')} (upstream {oracle.get('upstream_commit')}, {oracle.get('upstream_pr')}), "
        f"installed vllm {oracle.get('installed_vllm')} ({oracle.get('installed_commit_id')}), "
        f"fingerprints {ok}/{len(fingerprints)} ok"
    )


def _timing_line(report: dict[str, Any]) -> str:
    prefill = report.get("prefill", {})
    return (
        f"CUDA events around one call, {prefill.get('warmup', '?')} warm-up calls, median of "
        f"{prefill.get('repeats', '?')} (ms columns; the fastest call in the min columns); layouts and device "
        "metadata built before timing"
        + ("; the three loops timed in turn, their order rotating each round." if prefill.get("interleaved") else ".")
    )


def dcp_table(report: dict[str, Any]) -> pd.DataFrame:
    """The DCP row: each case on two real ranks over NCCL."""
    rows = report.get("dcp", {}).get("rows", [])
    frame = pd.DataFrame(
        rows,
        columns=[
            "case", "heads", "latent", "dtype", "interleave", "chunks", "oracle_kv_gathers", "ranks_agree",
            "bit_exact", "max_ulp", "oracle_ms", "port_ms", "error",
        ],
    )  # fmt: skip
    return frame.dropna(axis=1, how="all")


def sparse_markdown(section: dict[str, Any], heading: str) -> list[str]:
    """The sparse path's rows: masked L3 parity and the forward's time."""
    spec = section.get("spec") or {}
    latent = spec.get("kv_lora_rank", 0) + spec.get("qk_rope_head_dim", 0)
    lines = [
        f"{spec.get('num_heads')} heads, latent {latent}, {spec.get('dtype')}, index_topk "
        f"{section.get('index_topk')}. per_request against upstream's own `forward_mha` / "
        "`_compute_context_mha` (its Triton mask builder and merge compiled) on the shared CUDA kernels; the "
        "masked attention is the harness's deterministic reference (FlashAttention 4's masked kernel needs "
        "Blackwell)." + (f" {section['note']}" if section.get("note") else ""),
        "",
        pd.DataFrame(section.get("parity", [])).drop(columns=["detail"], errors="ignore").to_markdown(index=False),
        "",
    ]
    timing = section.get("timing")
    if timing:
        frame = pd.DataFrame(timing)
        paired = [_paired(t, "per_request", "upstream") for t in frame["timings"]] if "timings" in frame else []
        noise = _noise_columns("ratio", paired)
        for column, cells in noise.items():
            frame[column] = cells
        frame = frame.drop(columns=["timings"], errors="ignore")
        lines += [
            f"{heading}# Masked forward time",
            "",
            f"The masked path of the forward pass (suffix, context loop, final merge), plans and metadata built "
            f"before timing; CUDA events, {section.get('warmup')} warm-up calls, median of {section.get('repeats')}, "
            "the two interleaved. ratio: per_request over upstream"
            + (
                "; its spread is the interquartile range of the per-round ratios, and a spread holding 1 is a "
                "tie (reports/timing_noise.py)."
                if noise
                else "."
            ),
            "",
            frame.to_markdown(index=False),
            "",
        ]
    return lines


def gpu_section_markdown(report: dict[str, Any], heading: str = "##") -> list[str]:
    """The three tables with their headings, as Markdown lines."""
    lines = [f"{heading} Parity on the GPU", ""]
    problem = section_problem(report.get("parity"))
    if problem:
        lines += [f"Parity {problem}", ""]
    else:
        lines += [parity_table(report).to_markdown(index=False), ""]
        failures = report["parity"].get("first_failures", [])
        if failures:
            lines += ["First failing items:", "", *[f"- {f}" for f in failures], ""]
    lines += [f"{heading} Merge kernel", ""]
    problem = section_problem(report.get("merge"))
    if problem:
        lines += [f"Merge benchmark {problem}", ""]
    else:
        copy = report["merge"]["copy_GBps"]
        lines += [
            f"Device copy bandwidth (1 GiB clone, read + write): {copy:,.0f} GB/s. Kernel timings hold"
            " ten launches back to back (the host's launch latency hidden).",
            "",
        ]
        lines += [merge_table(report).to_markdown(index=False), ""]
    lines += [f"{heading} Prefill context loop", ""]
    problem = section_problem(report.get("prefill"))
    if problem:
        lines += [f"Prefill benchmark {problem}", ""]
    else:
        spec = report["prefill"].get("spec") or {}
        lines += [
            f"{spec.get('num_heads')} heads, latent {spec.get('kv_lora_rank', 0) + spec.get('qk_rope_head_dim', 0)} "
            f"({spec.get('kv_lora_rank')} + {spec.get('qk_rope_head_dim')} rope), {spec.get('dtype')}, block 16, "
            "W = 65536. Legacy: the equal-share grid (ports/equal_share); per-request: ports/per_request; "
            "upstream: vLLM's own `_compute_prefill_context` on the same shared kernels. " + _timing_line(report),
            "",
            prefill_table(report).to_markdown(index=False),
            "",
        ]
    if "sparse" in report:
        lines += [f"{heading} Sparse MLA: the masked prefill (sparse L3)", ""]
        problem = section_problem(report.get("sparse"))
        lines += [f"Sparse {problem}", ""] if problem else sparse_markdown(report["sparse"], heading)
    if "dcp" not in report and "parity" in report:
        gpus = (report.get("environment") or {}).get("device_count")
        lines += [
            f"{heading} DCP at L3 on real ranks",
            "",
            "Not run: this run's machine had "
            + (f"{gpus} GPU" if gpus else "one GPU")
            + " (the DCP row needs two; `tools/gpu_report.sh` runs it whenever two are visible).",
            "",
        ]
    if "dcp" in report:
        lines += [f"{heading} DCP at L3 on real ranks", ""]
        section = report["dcp"]
        problem = section_problem(section)
        if problem:
            lines += [f"DCP {problem}", ""]
        elif "skipped" in section:
            lines += [f"DCP skipped: {section['skipped']}", ""]
        else:
            lines += [
                f"World size {section.get('world_size')} over {section.get('backend')}, one GPU per rank, each "
                "rank's own cache; the all-gathers real: upstream's own MLADCPManager.kv_gather (init_kv_gather "
                "over the group; oracle_kv_gathers counts its calls on rank 0) for the oracle, "
                "all_gather_into_tensor for the port. ranks_agree: both ranks of each "
                "side gave the same bits; bit_exact: rank 0's per_request against upstream's DCP loop; ms: the "
                "context loop, the slower rank's median.",
                "",
                dcp_table(report).to_markdown(index=False),
                "",
            ]
    return lines


def render_markdown(report: dict[str, Any]) -> str:
    """The whole ``reports/gpu/<date>.md``."""
    lines = [
        f"# GPU parity and speed: {report.get('date', '?')}",
        "",
        f"- Machine: {environment_line(report)}.",
        f"- Oracle: {_oracle_line(report)}.",
        f"- Reproduce: `{report.get('command', '?')}` (docs/gpu.md).",
        "- Shared kernels: harness.kernels.CudaKernels (tensor-indexing gather, cuBLAS projection, "
        "FlashAttention-2 varlen with LSE); both sides call the same object on identical inputs.",
        "",
    ]
    problem = section_problem(report.get("environment"))
    if problem:
        lines += [f"Environment {problem}", ""]
    lines += gpu_section_markdown(report)
    return "\n".join(lines).rstrip() + "\n"


def write_figures_block(path: Path, report: dict[str, Any], page: Path = FIGURES_PAGE) -> None:
    """docs/figures.md's ``gpu`` block: this report's sections, from its JSON."""
    link = f"[reports/gpu/{path.stem}.md](../reports/gpu/{path.stem}.md)"
    markdown = "\n".join(
        [f"Measured by `{report.get('command', '?')}` on {environment_line(report)}; the whole report: {link}.", ""]
        # The report's sections sit under the page's own heading for the GPU.
        + [f"#{line}" if line.startswith("## ") else line for line in gpu_section_markdown(report)]
    )
    write_figures("gpu", markdown, f"python -m reports.gpu {path.name}", None, page)


def main(argv: list[str] | None = None) -> int:
    """Re-render ``<date>.md`` beside each given ``<date>.json`` (after a change to
    this renderer, or once a GPU run's files are fetched: the figures are the
    JSON's, measured where it was written), and docs/figures.md's GPU block
    from the newest of them."""
    import sys

    from harness.cases.fields import CaseError
    from harness.cases.json_input import read_json

    paths = sorted(Path(name) for name in (argv if argv is not None else sys.argv[1:]))
    try:
        reports = [read_json(path, what="not a GPU report") for path in paths]
    except CaseError as exc:
        print(f"reports.gpu: error: {exc}", file=sys.stderr)
        return 2
    for path, report in zip(paths, reports, strict=True):
        markdown = render_markdown(report)
        path.with_suffix(".md").write_text(markdown, encoding="utf-8")
        print(f"wrote {path.with_suffix('.md')}")
    if paths:
        write_figures_block(paths[-1], reports[-1])
        print(f"wrote the gpu block of {FIGURES_PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
