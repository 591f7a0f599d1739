"""Issue 24, parts 2 and 3: what fewer bytes and a compiled step do to quality and to decode speed, in one run.

    .venv/bin/python benchmarks/precision.py [--new-tokens 64] [--rounds 3] [--no-compile] [--smoke]

1. **Quality**, on the shipped text model: perplexity of held-out text and
   greedy agreement with float32 over a set of prompts, for float32,
   bfloat16 and float16 (``GPT.to(dtype)``: weights, activations, cache) and
   int8 weights (``GPT.quantize("int8")``, the kernels this machine's probe picks).
2. **Speed**, on a gpt2-small-shaped GPT with seeded random weights, batch 1:
   decode tokens/s of attnlab in each precision beside Hugging Face's
   ``generate`` in float32, after checking that attnlab's float32 tokens are
   Hugging Face's. Interleaved rounds; ratios with their spread; each step
   as a fraction of its floor (its weight bytes at the float32 stream rate
   probed in this run: a fraction over 1 reads its weights faster than
   float32 streams).

``attnlab float32 auto`` is float32 with every weight in the layout this
machine streams faster for its shape (``GPT.set_layout("auto")``), its
tokens checked against float32's first; ``attnlab float32 compiled`` is
``generate(compile=True)`` (inductor; its compile is the warm-up, not timed),
its tokens checked too.
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from attnlab.bench.timing import NOISY, interleaved
from attnlab.models import GPT, GPTConfig
from attnlab.models.locate import locate
from attnlab.models.tasks import TextTask, stdlib_text

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _cast(model: GPT, *, dtype: torch.dtype) -> GPT:
    return model.to(dtype)


def _variants() -> dict[str, Callable[[GPT], GPT]]:
    """Each precision: what it does to a float32 model."""
    made: dict[str, Callable[[GPT], GPT]] = {name: functools.partial(_cast, dtype=d) for name, d in DTYPES.items()}

    def int8(model: GPT) -> GPT:
        model.quantize("int8")
        return model

    made["int8"] = int8
    return made


@torch.no_grad()
def quality(prompts: int, length: int) -> None:
    task = TextTask(stdlib_text(), seq_len=length)
    text = task.batch(prompts, torch.Generator().manual_seed(11), split="eval")[0]  # (B, length)
    reference: torch.Tensor | None = None
    base_ppl = 0.0
    for name, make in _variants().items():
        model = make(GPT.from_pretrained(locate("text")).eval())
        logits = model(text[:, :-1]).float()
        ppl = math.exp(float(F.cross_entropy(logits.flatten(0, 1), text[:, 1:].flatten())))
        out = model.generate(text[:, : length // 2], length // 4)
        if reference is None:
            reference, base_ppl = out, ppl
        agree = float((out == reference).float().mean())
        print(
            f"  {name:<9} perplexity {ppl:.4f} ({ppl / base_ppl - 1:+.3%} against float32), greedy agreement {agree:.1%}"
        )


def timed(cases: dict[str, Callable[[], object]], rounds: int, new: int, floors: dict[str, float]) -> None:
    times = interleaved(cases, rounds)
    base = times["hf float32"]
    for name, ts in times.items():
        ratios = [b / t for t, b in zip(ts, base, strict=True)]  # speed relative to HF float32
        ratio = statistics.median(ratios)
        spread = (max(ratios) - min(ratios)) / ratio
        flag = "" if spread <= NOISY else "  (too noisy to trust)"
        step = statistics.median(ts) / new
        floor = f"  {floors[name] / step:4.2f} of its floor" if name in floors else ""
        print(
            f"  {name:<24} {new / statistics.median(ts):7.1f} tokens/s  {ratio:5.2f}x HF float32  "
            f"spread {spread:4.0%}{floor}{flag}"
        )


@torch.no_grad()
def speed(new: int, rounds: int, overrides: dict[str, int], compiled: bool) -> None:
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    config = GPTConfig.preset("gpt2-small", drop_rate=0.0, qkv_bias=True, **overrides)
    torch.manual_seed(0)
    ours = GPT(config).eval()
    prompt = torch.randint(0, config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as folder:
        ours.save_pretrained(folder)
        hf = GPT2LMHeadModel.from_pretrained(folder).eval()
    ones = torch.ones_like(prompt)

    def hf_generate() -> torch.Tensor:
        return hf.generate(
            prompt, attention_mask=ones, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )

    if not torch.equal(hf_generate(), ours.generate(prompt, new)):
        raise SystemExit("attnlab's float32 tokens differ from Hugging Face's on the same weights")
    models = {}
    for name, make in _variants().items():
        model = GPT(config).eval()
        model.load_state_dict(ours.state_dict(), strict=True)
        models[name] = make(model)
    print(f"  int8 kernels: {sorted(set(_kernels(models['int8'])))}")
    cases: dict[str, Callable[[], object]] = {"hf float32": hf_generate}
    for name, model in models.items():
        cases[f"attnlab {name}"] = lambda m=model: m.generate(prompt, new)  # type: ignore[misc]
    measured = GPT(config).eval()
    measured.load_state_dict(ours.state_dict())
    chosen = measured.set_layout("auto")  # each weight shape in the layout this machine streams faster
    if not torch.equal(measured.generate(prompt, new), ours.generate(prompt, new)):
        raise SystemExit("the measured layout changed the tokens")
    print(f"  layout='auto' chose: {', '.join(f'{n} {c}' for n, c in sorted(set(_by_shape(measured, chosen))))}")
    cases["attnlab float32 auto"] = lambda: measured.generate(prompt, new)
    if compiled:
        started = time.perf_counter()
        if not torch.equal(ours.generate(prompt, new, compile=True), ours.generate(prompt, new)):
            raise SystemExit("the compiled step changed the tokens")
        print(f"  compiled the decode step in {time.perf_counter() - started:.0f} s (not timed below)")
        cases["attnlab float32 compiled"] = lambda: ours.generate(prompt, new, compile=True)
    floors = _floors(config, prompt.shape[1] + new / 2)
    timed(cases, rounds, new, floors)


def _kernels(model: GPT) -> list[str]:
    from attnlab.linear.quantized import Int8Linear

    return [f"{m.in_features}x{m.out_features} {m.kernel}" for m in model.modules() if isinstance(m, Int8Linear)]


def _floors(config: GPTConfig, position: float) -> dict[str, float]:
    """Seconds per token to read each case's bytes at the float32 rate probed now (the faster layout's, on the
    blocks' widest weight): its floor were it to stream as fast as float32 does."""
    from attnlab.bench.roofline import decode_bytes, probe_rates

    rate = max(probe_rates(config.emb_dim, 4 * config.emb_dim).values()) * 1e9  # bytes/s
    fp32 = decode_bytes(config, position)
    seconds = {
        name: decode_bytes(config, position, element=b).weights / rate for name, b in (("bfloat16", 2), ("float16", 2))
    }
    seconds["int8"] = decode_bytes(config, position, element=1).weights / rate
    floors = {f"attnlab {name}": s for name, s in seconds.items()}
    for name in ("hf float32", "attnlab float32", "attnlab float32 auto", "attnlab float32 compiled"):
        floors[name] = fp32.weights / rate
    print(
        f"  float32 streams at {rate / 1e9:.1f} GB/s here (probed now); a float32 step reads {fp32.weights / 1e6:.0f} MB"
    )
    return floors


def _by_shape(model: GPT, chosen: dict[str, str]) -> list[tuple[str, str]]:
    params = dict(model.named_parameters())
    return [("x".join(map(str, params[name].shape)), layout) for name, layout in chosen.items() if name in params]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--no-compile", action="store_true", help="leave out the compiled step (its compile takes a while)"
    )
    parser.add_argument("--smoke", action="store_true", help="a tiny model, a few tokens: that it runs")
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("quality on the shipped text model (held-out text):")
    quality(2 if args.smoke else 8, 64 if args.smoke else 256)
    shrink = {"vocab_size": 512, "context_length": 64, "emb_dim": 64, "n_heads": 4, "n_layers": 2} if args.smoke else {}
    print(f"decode speed, {'a tiny' if args.smoke else 'a gpt2-small-shaped'} GPT, batch 1, greedy:")
    speed(
        4 if args.smoke else args.new_tokens,
        1 if args.smoke else args.rounds,
        shrink,
        not (args.no_compile or args.smoke),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
