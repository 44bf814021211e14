"""Writes the hand-picked smoke cases under cases/smoke/ (one JSON file each).

Each entry below was chosen for one edge of SPEC section 1 and says which in its
description. Run it after editing the catalogue: ``python tools/write_smoke_cases.py``.
"""

from __future__ import annotations

from pathlib import Path

from harness.cases.files import case_from_json, write_case_file

OUT = Path(__file__).resolve().parent.parent / "cases" / "smoke"


def q(n: int, length: int = 7) -> list[int]:
    return [length] * n


CATALOGUE: list[dict[str, object]] = []


def add(
    name: str,
    family: str,
    description: str,
    context_lens: list[int],
    query_lens: list[int] | None = None,
    block_size: int = 16,
    workspace_size: int = 2048,
    **extra: object,
) -> None:
    CATALOGUE.append(
        {
            "name": f"smoke-{name}",
            "family": family,
            "description": description,
            "context_lens": context_lens,
            "query_lens": query_lens or q(len(context_lens)),
            "block_size": block_size,
            "workspace_size": workspace_size,
            **extra,
        }
    )


# Upstream's worst case and other skews.
add(
    "upstream-worst-case",
    "skew",
    "SPEC 1a: legacy 30 chunks, per-request 1",
    [60000] + [16] * 31,
    [513] * 32,
    16,
    65536,
)
add(
    "worst-case-small-ws",
    "skew",
    "upstream's shape in a workspace too small for the giant",
    [60000] + [16] * 31,
    [513] * 32,
    16,
    16384,
)
add("giant-first", "skew", "giant request first, tiny ones after", [5000, 3, 5, 16, 17], None, 16, 2048)
add("giant-last", "skew", "tiny requests then a giant one that must split", [3, 5, 16, 17, 5000], None, 16, 2048)
add("giant-middle", "skew", "giant in the middle splits and continues", [40, 41, 7000, 9, 10], None, 16, 2048)
add("two-giants", "skew", "two giants back to back", [4100, 4100], None, 16, 2048)
add("giants-and-dust", "skew", "giants separated by single-row requests", [1, 3000, 1, 3000, 1], None, 64, 1024)
add("skew-block128", "skew", "skew with 128-row blocks", [20000, 100, 200, 300], None, 128, 8192)
# Uniform.
add("uniform-fit", "uniform", "8 equal requests that fill the workspace exactly", [256] * 8)
add("uniform-overflow", "uniform", "8 equal requests, one row more than fits", [257] * 8)
add("uniform-single-row", "uniform", "many one-row contexts", [1] * 100, None, 16, 64)
add("uniform-block1", "uniform", "block size 1: every split is allowed", [100] * 7, None, 1, 250)
# Zero-context requests.
add("zero-leading", "zero-context", "zero-context requests before all others", [0, 0, 500, 600])
add("zero-trailing", "zero-context", "zero-context requests after all others", [500, 600, 0, 0])
add("zero-run-middle", "zero-context", "a run of zero-context requests ends a chunk's run", [300, 0, 0, 0, 400])
add("zero-alternating", "zero-context", "every other request has no context", [100, 0, 100, 0, 100, 0])
add("zero-all", "zero-context", "no request has context: no chunked-context metadata", [0, 0, 0])
add("zero-single", "zero-context", "one request, no context", [0])
add("zero-after-split", "zero-context", "a split request followed by zero-context requests", [5000, 0, 0, 30])
add("zero-between-giants", "zero-context", "zero-context between two giants that each split", [3000, 0, 3000])
add("zero-one-of-many", "zero-context", "a single zero among many small", [10] * 20 + [0] + [10] * 20, None, 16, 128)
# Exact fits.
add("exact-at", "exact-fit", "total context exactly W", [1000, 1048])
add("exact-minus-one", "exact-fit", "total context W-1", [1000, 1047])
add("exact-plus-one", "exact-fit", "total context W+1", [1000, 1049])
add("exact-minus-block", "exact-fit", "total context W-block", [1000, 1032])
add("exact-plus-block", "exact-fit", "total context W+block", [1000, 1064])
add("exact-single-at", "exact-fit", "one request exactly W: fits whole, no split", [2048])
add("exact-single-plus-one", "exact-fit", "one request W+1: split at W, one-row tail", [2049])
add("exact-single-minus-one", "exact-fit", "one request W-1", [2047])
add("exact-unaligned-ws", "exact-fit", "unaligned workspace, total context exactly W", [1000, 1050], None, 16, 2050)
# Long single requests.
add("long-10x", "long-single", "one request ten workspaces long", [20480])
add("long-10x-plus", "long-single", "one request ten workspaces plus a tail", [20481])
add("long-unaligned-ws", "long-single", "long request, workspace not a block multiple", [10000], None, 16, 1000)
add("long-with-neighbours", "long-single", "long request between small ones", [100, 9000, 100])
add("long-block128", "long-single", "long request, 128-row blocks", [50000], None, 128, 4096)
add("long-block1", "long-single", "long request, block size 1", [5000], None, 1, 999)
# Unaligned tails.
add("tails-17", "unaligned-tails", "contexts 1 past a block", [17, 33, 49, 65], None, 16, 64)
add("tails-15", "unaligned-tails", "contexts 1 short of a block", [15, 31, 47, 63], None, 16, 64)
add(
    "tails-split", "unaligned-tails", "split at a block boundary leaves an unaligned tail", [1000, 1001], None, 64, 1024
)
add("tails-remaining-minus-one", "unaligned-tails", "remaining one past an aligned length", [64, 65], None, 64, 64)
add("tails-odd-ws", "unaligned-tails", "odd workspace, odd contexts", [77, 91, 123], None, 16, 100)
# Many requests.
add("many-512", "many-requests", "512 small requests", [3, 17, 0, 40] * 128, None, 16, 1024)
add("many-1024-ones", "many-requests", "1024 one-row requests", [1] * 1024, None, 16, 256)
add(
    "many-600-mixed",
    "many-requests",
    "600 requests with zeros and a giant",
    [*([5, 0, 12] * 200)[:599], 9000],
    None,
    16,
    2048,
)
# Tiny workspaces.
add("tiny-one-block", "tiny-workspace", "workspace of exactly one block", [40, 16, 0, 3], None, 16, 16)
add("tiny-one-row", "tiny-workspace", "block 1, workspace 1", [3, 0, 2], None, 1, 1)
add("tiny-block-plus", "tiny-workspace", "workspace one block and a bit", [70, 5], None, 16, 20)
add("tiny-block128", "tiny-workspace", "workspace of one 128-row block", [300, 1, 128, 129], None, 128, 128)
# Split alignment off.
add(
    "noalign-split",
    "unaligned-split",
    "alignment off: split at any row",
    [1000, 1049],
    None,
    16,
    2048,
    align_to_block=False,
)
add("noalign-long", "unaligned-split", "alignment off: long request", [7001], None, 16, 1000, align_to_block=False)
add("noalign-many", "unaligned-split", "alignment off: many small", [33] * 40, None, 16, 100, align_to_block=False)
# Decode-context parallel.
for world in (2, 4, 8):
    for interleave in (1, 16, 64):
        block = {1: 16, 16: 64, 64: 128}[interleave]
        add(
            f"dcp{world}-i{interleave}-b{block}",
            "dcp",
            f"DCP world {world}, interleave {interleave}, block {block}: skew with a zero",
            [9000, 0, 37, 300, 1, 2500],
            None,
            block,
            4096,
            dcp_world_size=world,
            cp_kv_cache_interleave_size=interleave,
        )
add(
    "dcp-tiny",
    "dcp",
    "DCP workspace of one alignment unit",
    [700, 3, 0, 129],
    None,
    16,
    128,
    dcp_world_size=8,
    cp_kv_cache_interleave_size=16,
)
add(
    "dcp-unaligned-ws",
    "dcp",
    "DCP workspace not an alignment multiple",
    [5000, 17],
    None,
    64,
    1000,
    dcp_world_size=4,
    cp_kv_cache_interleave_size=16,
)
add(
    "dcp-many",
    "dcp",
    "DCP with 512 requests",
    [5, 70, 0, 200] * 128,
    None,
    16,
    2048,
    dcp_world_size=2,
    cp_kv_cache_interleave_size=1,
)
# Numeric (L3) hand-picked cases: continuations next to zero-context requests.
add(
    "numeric-continuation-zero",
    "zero-context",
    "L3: a request split over 3 chunks between zero-context requests",
    [0, 300, 0, 45],
    [3, 4, 2, 3],
    16,
    128,
    numeric={"preset": "tiny", "seed": 11},
)
add(
    "numeric-continuation-fp16",
    "long-single",
    "L3 fp16: many continuations of one request",
    [700],
    [5],
    16,
    128,
    numeric={"preset": "tiny", "seed": 12, "dtype": "fp16"},
)
add(
    "numeric-continuation-fp32",
    "zero-context",
    "L3 fp32: continuation then a zero-context request",
    [200, 0, 17],
    [2, 3, 4],
    16,
    64,
    numeric={"preset": "tiny", "seed": 13, "dtype": "fp32"},
)
add(
    "numeric-single-chunk",
    "single-chunk",
    "L3: the single-chunk fast path (no empty slices)",
    [40, 33, 7],
    [3, 2, 5],
    16,
    128,
    numeric={"preset": "tiny", "seed": 14},
)
add(
    "numeric-worst-case-shape",
    "skew",
    "L3: upstream's worst-case shape, scaled down",
    [600] + [16] * 7,
    [3] * 8,
    16,
    1024,
    numeric={"preset": "tiny", "seed": 15},
)

# Keyless rows (seeds/003): the shared kernels' report on a query row without
# keys, set per case. Requests with context first and zero-context ones last,
# as the legacy engine orders them (its final merge covers only the tokens of
# requests before the first zero-context one), on a legacy grid that cuts every
# request where the oracle does: equal_share is bit-exact with the oracle here
# only because it neutralises the keyless rows.
add(
    "keyless-finite",
    "zero-context",
    "L3, keyless rows with a finite LSE and garbage output: a request whose context runs out after the "
    "first of two legacy chunks, before one split where the oracle splits it and a zero-context one; "
    "the legacy grid is bit-exact only if it neutralises them",
    [16, 24, 0],
    [2, 3, 2],
    16,
    32,
    numeric={"preset": "tiny", "seed": 16, "keyless_rows": "finite"},
)
add(
    "keyless-pos-inf",
    "zero-context",
    "L3, keyless rows with FlashAttention's +inf LSE: a one-chunk legacy grid over two requests with "
    "context and two zero-context ones keeps +inf in its context LSE unless it neutralises them",
    [40, 25, 0, 0],
    [2, 3, 1, 2],
    16,
    128,
    numeric={"preset": "tiny", "seed": 17, "keyless_rows": "pos-inf"},
)


# Integer widths and non-powers of two: the smallest batches past each
# boundary a port's integer types or power-of-two arithmetic could break on.
add(
    "widths-chunk-300-requests",
    "widths",
    "a chunk of 300 one-row requests: chunk-local request indices past 255 (uint8)",
    [1] * 300,
    [1] * 300,
    1,
    512,
)
add(
    "widths-dcp-chunk-200-requests",
    "widths",
    "DCP 2: a chunk of 200 requests with context: padded request indices past 127 (int8)",
    [1] * 200,
    [1] * 200,
    16,
    4096,
    dcp_world_size=2,
)
add(
    "widths-dcp-local-start-past-int16",
    "widths",
    "DCP 2: one 100,000-row context in W 65536: local starts past 32,767 (int16)",
    [100000],
    [1],
    16,
    65536,
    dcp_world_size=2,
)
add(
    "dcp3-block16-lcm",
    "widths",
    "DCP 3 with block 16: the alignment is lcm(16, 3) = 48, not max(16, 3)",
    [1000],
    [1],
    16,
    500,
    dcp_world_size=3,
)
add(
    "dcp3-padded",
    "widths",
    "DCP 3: I*D = 3 is not a power of two: padded(n) and the per-rank lengths are no shift or mask",
    [100, 50],
    [1, 1],
    16,
    480,
    dcp_world_size=3,
)
add(
    "block528-split",
    "widths",
    "block 528 (hybrid models): rounding a split down to 528 rows is not a bit mask",
    [2000],
    [1],
    528,
    1584,
)
add(
    "widths-l3-chunk-300-requests",
    "widths",
    "L3: 300 one-row requests in one chunk: the gather's chunk-local request index past 255",
    [1] * 300,
    [1] * 300,
    1,
    512,
    numeric={"preset": "narrow", "seed": 18},
)

# DCP at L3: per-rank caches, the all-gather and the reorder.
add(
    "numeric-dcp3-interleave4",
    "hand-picked",
    "DCP at L3: world 3, interleave 4, a request continued over three chunks beside a short and a "
    "zero-context one; every rank's cache holds only its interleaved rows.",
    [300, 17, 0, 90],
    [1, 1, 2, 1],
    16,
    96,
    dcp_world_size=3,
    cp_kv_cache_interleave_size=4,
    numeric={"preset": "tiny", "seed": 5, "dtype": "fp16"},
)


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for old in OUT.glob("*.json"):
        old.unlink()
    for entry in CATALOGUE:
        description = str(entry.pop("description"))
        case = case_from_json(entry, str(entry["name"]))
        write_case_file(case, OUT / f"{case.name.removeprefix('smoke-')}.json", description)
    print(f"wrote {len(CATALOGUE)} cases to {OUT}")


if __name__ == "__main__":
    main()
