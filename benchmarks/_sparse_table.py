"""benchmarks/sparse.py's tables and sentences, every figure from a saved run (its ``--render``)."""

from __future__ import annotations

import statistics
from typing import Any

from _verdicts import judged
from attnlab.bench.timing import NOISY, spread


def per_token(row: dict[str, Any]) -> tuple[float, float]:
    """(keys read, state bytes) a token for the zoo's layers: the measured period's, times its repeats."""
    repeats = row["zoo_layers"] / row["layers_measured"]
    return sum(row["keys_by_layer"]) * repeats, row["state_bytes"] / row["tokens"] * repeats


def _reads(result: dict[str, Any]) -> dict[tuple[str, int], dict[str, Any]]:
    return {(row["variant"], row["tokens"]): row for row in result["reads"]}


def ratio(at: dict[str, Any], sparse: str, dense: str) -> tuple[float, float]:
    """dense's time over sparse's (above 1: sparse faster), median of the per-round ratios, and their spread."""
    times = at["seconds_a_token"]
    rounds = [d / s for d, s in zip(times[dense], times[sparse], strict=True)]
    return statistics.median(rounds), spread(rounds)


def pays_from(result: dict[str, Any], sparse: str) -> tuple[int | None, bool]:
    """The shortest length from which ``sparse`` was faster than its dense variant at every longer one, each
    ratio met past its spread (None: at no length); and whether every ratio's spread was within the noise rule."""
    dense = result["sparse"][sparse]
    verdicts = [(at["tokens"], judged(*_ratio_args(at, sparse, dense))) for at in result["decode"]]
    trusted = all(ratio(at, sparse, dense)[1] <= NOISY for at in result["decode"])
    start = None
    for tokens, verdict in reversed(verdicts):
        if verdict != "met":
            break
        start = tokens
    return start, trusted


def _ratio_args(at: dict[str, Any], sparse: str, dense: str) -> tuple[float, float, float]:
    r, wide = ratio(at, sparse, dense)
    return r, 1.0, wide


def line(result: dict[str, Any], name: str) -> tuple[float, float]:
    """(seconds at no context, seconds more a token of context): the least-squares line through a variant's
    median time a decoded token at each length timed."""
    xs = [float(at["tokens"]) for at in result["decode"]]
    ys = [statistics.median(at["seconds_a_token"][name]) for at in result["decode"]]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def _fitted(result: dict[str, Any], sparse: str, dense: str) -> str:
    """Where the two fitted lines cross: an extrapolation, said as one."""
    (a_s, b_s), (a_d, b_d) = line(result, sparse), line(result, dense)
    per_k = f"{b_d * 1024 * 1e3:.3f} ms more a token for each 1,024 tokens of context against {b_s * 1024 * 1e3:.3f}"
    if b_d <= b_s:
        return f"Fitted lines: {dense} takes {per_k} for {sparse}, so the lines never cross."
    cross = (a_s - a_d) / (b_d - b_s)
    longest, shortest = result["decode"][-1]["tokens"], result["decode"][0]["tokens"]
    if cross < shortest:  # the sparse line lies below the dense one over every length timed, and rises slower
        return (
            f"Fitted lines: {dense} takes {per_k} for {sparse}, and {sparse}'s line lies below {dense}'s from the "
            "shortest length timed on (read each length's ratio above for what the noise rule allows)."
        )
    where = (
        "past the longest length timed: an extrapolation, not a measurement"
        if cross > longest
        else "inside the lengths timed, where the ratios above are the measurement"
    )
    return f"Fitted lines: {dense} takes {per_k} for {sparse}; they cross near {cross:,.0f} tokens ({where})."


def _reads_table(result: dict[str, Any]) -> list[str]:
    reads = _reads(result)
    lines = [
        "| tokens | variant | keys read by each measured layer | keys read a token (4 layers) | of mha's | "
        "state bytes a token (4 layers) | of mla's |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["reads"]:
        keys, held = per_token(row)
        mha_keys, _ = per_token(reads[("mha", row["tokens"])])
        _, mla_bytes = per_token(reads[("mla", row["tokens"])])
        lines.append(
            f"| {row['tokens']:,} | {row['variant']} | {' + '.join(map(str, row['keys_by_layer']))} | {keys:,.0f} | "
            f"{keys / mha_keys:.1%} | {held:,.1f} | {held / mla_bytes:.1%} |"
        )
    return lines


def _decode_table(result: dict[str, Any]) -> list[str]:
    names = list(result["decode"][0]["seconds_a_token"])
    pairs = list(result["sparse"].items())
    head = [*(f"{n} ms a token" for n in names), *(f"{s} against {d}" for s, d in pairs)]
    lines = ["| context | " + " | ".join(head) + " |", "|---" * (len(head) + 1) + "|"]
    for at in result["decode"]:
        cells = [f"{statistics.median(ts) * 1e3:.2f} ({spread(ts):.0%})" for ts in at["seconds_a_token"].values()]
        for sparse, dense in pairs:
            r, wide = ratio(at, sparse, dense)
            cells.append(f"{r:.2f}x, spread {wide:.0%}: {judged(r, 1.0, wide)}")
        lines.append(f"| {at['tokens']:,} | " + " | ".join(cells) + " |")
    return lines


def _selection(result: dict[str, Any]) -> list[str]:
    """How long a context must be for selection to act, from the measured reads and the zoo's shapes."""
    reads, shapes = _reads(result), result["shapes"]
    lengths = sorted({row["tokens"] for row in result["reads"]})
    out = []
    if "dsa" in result["sparse"]:
        k = shapes["dsa_topk"]
        said = [f"{reads[('dsa', n)]['keys_by_layer'][0]:,} of {n:,}" for n in lengths]
        out.append(
            f"- dsa: each layer read {', '.join(said)} keys at {', '.join(f'{n:,}' for n in lengths)} tokens. Its "
            f"top-{k} covers a context of {k} tokens or fewer, which it reads whole, as dense mla does; past {k} "
            f"it reads {k} whatever the length. The zoo trains on {shapes['seq_len']} tokens, so its queries past "
            f"position {k} select ({shapes['seq_len'] - k} of {shapes['seq_len']}): selection acts in training, "
            f"and at {lengths[-1]:,} a query reads {k / lengths[-1]:.2%} of the keys. The indexer still scores every key."
        )
    if "compressed" in result["sparse"]:
        w, m, big, k = shapes["window"], shapes["sparse_block"], shapes["heavy_block"], shapes["v4_topk"]
        said = [f"{' + '.join(map(str, reads[('compressed', n)]['keys_by_layer']))} at {n:,}" for n in lengths]
        fewer = [n for n in lengths if per_token(reads[("compressed", n)])[0] < per_token(reads[("mha", n)])[0]]
        past = fewer[0] if fewer else None
        out.append(
            f"- compressed (compressed-sparse + heavily compressed): {'; '.join(said)} tokens, each the window's "
            f"{w} tokens and the entries read. A compressed-sparse layer's entries close every {m} tokens and it "
            f"reads its top {k} once more than {k} have closed ({k * m} tokens); a heavily compressed layer reads "
            f"every entry, one a {big} tokens, so its reads still grow, {big}x slower than dense. At short contexts "
            f"the entries come on top of the window, which already holds every token: "
            + (
                f"it reads fewer keys than dense from {past:,} tokens of those measured."
                if past is not None
                else "it read no fewer keys than dense at any length measured."
            )
        )
    if "moba" in result["sparse"]:
        block, top = shapes["moba_block"], shapes["moba_topk"]
        said = [f"{reads[('moba', n)]['keys_by_layer'][0]:,} of {n:,}" for n in lengths]
        out.append(
            f"- moba: the first layer read {', '.join(said)} keys at {', '.join(f'{n:,}' for n in lengths)} tokens, "
            f"a key once however many of its {shapes['heads']} heads read it. Each head reads its own block of "
            f"{block} and the {top - 1} best before it, {top * block} keys: a context of {top * block} tokens or "
            f"fewer is read whole, as dense attention reads it. The zoo trains on {shapes['seq_len']} tokens, so "
            f"its queries past position {top * block} select. The heads choose apart, so between them a layer "
            f"reads up to {shapes['heads'] * top * block} keys, and fewer where their choices meet."
        )
    if "nsa" in result["sparse"]:
        said = [f"{reads[('nsa', n)]['keys_by_layer'][0]:,} of {n:,}" for n in lengths]
        dense = all(per_token(reads[("nsa", n)])[0] >= per_token(reads[("mha", n)])[0] for n in lengths)
        share = per_token(reads[("nsa", lengths[-1])])[0] / per_token(reads[("mha", lengths[-1])])[0]
        verdict = (
            "so in this form NSA read as many keys as dense attention at every length measured"
            if dense
            else f"so in this form NSA read {share:.0%} of dense attention's keys at {lengths[-1]:,} tokens"
        )
        out.append(
            f"- nsa: the first layer read {', '.join(said)} keys at {', '.join(f'{n:,}' for n in lengths)} "
            f"tokens, counting every key its three branches drew on. Its selected branch reads "
            f"{shapes['nsa_select_n']} blocks of {shapes['nsa_select_block']} a group and its window "
            f"{shapes['nsa_slide']}, but its compressed entries (a block of {shapes['nsa_compress_block']} every "
            f"{shapes['nsa_stride']} tokens) are made again from every closed block's keys at each call: a query "
            f"draws on every key before its latest entry, {verdict}. A cache of the entries, as DeepSeek-V4's "
            "layers keep, is what would cut it."
        )
    return out


def _periods(result: dict[str, Any]) -> str:
    """The layers measured for each variant, from the run's own rows: "mha, mla: 1 layer; compressed: 2"."""
    shortest = min(row["tokens"] for row in result["reads"])
    by_count: dict[int, list[str]] = {}
    for row in result["reads"]:
        if row["tokens"] == shortest:
            by_count.setdefault(row["layers_measured"], []).append(row["variant"])
    return "; ".join(
        f"{', '.join(names)}: {n} layer{'s' if n > 1 else ''}" if i == 0 else f"{', '.join(names)}: {n}"
        for i, (n, names) in enumerate(sorted(by_count.items()))
    )


def _layers(n: int) -> str:
    return "the zoo's whole models (4 layers)" if n == 4 else f"the first {n} layers of the zoo's models"


def render(result: dict[str, Any]) -> str:
    """The section: keys and bytes, decode, where sparse pays, how long selection needs; all from the run."""
    lines = ["Keys read and state bytes a token (float32), measured on caches filled to each length:", ""]
    lines += _reads_table(result)
    lines += [
        "",
        f"Decode, {_layers(result['decode_layers'])}, {result['steps']} tokens a round "
        "(context: the tokens the cache held before them):",
        "",
    ]
    lines += _decode_table(result)
    lines.append("")
    for sparse, dense in result["sparse"].items():
        start, trusted = pays_from(result, sparse)
        where = (
            f"pays from {start:,} tokens of context on, of those timed"
            if start is not None
            else f"did not pay at any length timed (up to {result['decode'][-1]['tokens']:,})"
        )
        caveat = "" if trusted else " Some ratios spread past the noise rule: those lengths judge nothing."
        lines.append(f"- {sparse} against {dense}: {where}.{caveat} {_fitted(result, sparse, dense)}")
    lines += ["", "How long a context must be for selection to act:", ""]
    lines += _selection(result)
    smoke = " (smoke: short lengths, not a measurement)" if result["smoke"] else ""
    lines.append(
        f"\n`{result['command']}` ({result['date']}, torch {result['torch']}, {result['threads']} threads, "
        f"{result['cpu']}){smoke}: the zoo's variants with random weights. Keys read: one decoded token after a "
        "cache filled to the length's other tokens, from each gathering layer's own meter (the slots its kernel "
        "gathered) and each dense layer's unmasked scores (`attnlab.bench.sparse_meter`); measured on one period "
        f"of each variant's layers at the zoo's layer shapes ({_periods(result)}), the longest "
        f"length on the decode models' {result['decode_layers']} layers, whose caches were built for it and "
        "filled to it; the 4-layer figures are the layers measured times their repeats. State bytes: the cache's "
        "tensors, built for the length and holding it. Caches are filled by a twin of each model on the flash "
        f"kernel, {result['chunk']} tokens a call; metering and timing run the model's own default kernels. "
        f"Decode: each variant's time a token is the median of {result['rounds']} interleaved rounds "
        "(spread: (max - min) / median); each ratio is the median of the per-round ratios, dense time over "
        f"sparse, judged against 1 with the project's rule (a spread past {NOISY:.0%} judges nothing). The run "
        f"took {result['seconds'] / 60:.1f} minutes."
    )
    return "\n".join(lines)
