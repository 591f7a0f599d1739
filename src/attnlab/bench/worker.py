"""One benchmark case, run in its own process: check, warm up, time, measure memory.

    python -m attnlab.bench.worker '{"impl": "attnlab-auto", "seq": 1024, ...}'

Prints one JSON object. Running each case in a fresh process makes its peak
RSS its own. The output is compared with the reference (the book's
MultiHeadAttention computed in float64 on the same weights and input, over the
first ``check_len`` tokens) before anything is timed; a case that disagrees is
reported as refused and not timed.
"""

from __future__ import annotations

import json
import resource
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

from attnlab.bench.impls import build, reference_weights
from attnlab.bench.memory import PeakMemory
from attnlab.bench.timing import interleaved
from attnlab.cache import KVCache, ModelCache
from attnlab.nn.attention import Attention

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}
TOLERANCE = {"float32": 1e-4, "float64": 1e-8, "bfloat16": 3e-2, "float16": 1e-2}


def _median_seconds(fn: Callable[[], object], repeats: int, warmup: int) -> tuple[float, list[float]]:
    samples = interleaved({"one": fn}, repeats, warmup=warmup)["one"]
    return statistics.median(samples), samples


def check(model: torch.nn.Module, ref: torch.nn.Module, x: torch.Tensor, dtype_name: str) -> tuple[bool, float]:
    """Max relative error of model(x) against the float64 reference on the same weights."""
    with torch.no_grad():
        expected = ref.double()(x.double())
        got = model(x).double()
    err = ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()
    return bool(err <= TOLERANCE[dtype_name]), err


def check_backward(
    model: torch.nn.Module, ref: torch.nn.Module, x: torch.Tensor, dtype_name: str
) -> tuple[bool, float]:
    """Max relative error of d(sum(model(x) * w))/dx against the float64 reference's, for a fixed weighting w."""
    x64 = x.double().requires_grad_()
    out = ref.double()(x64)
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (expected,) = torch.autograd.grad((out * w).sum(), x64)
    xg = x.detach().clone().requires_grad_()
    (got,) = torch.autograd.grad((model(xg).double() * w).sum(), xg)
    err = ((got.double() - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()
    return bool(err <= TOLERANCE[dtype_name]), err


def check_decode(
    model: torch.nn.Module, ref: torch.nn.Module, x: torch.Tensor, dtype_name: str, impl: str
) -> tuple[bool, float]:
    """The timed decode step, run on ``x``, against the float64 reference's last row over x and the new token."""
    new = torch.randn(x.shape[0], 1, x.shape[2], generator=torch.Generator().manual_seed(4), dtype=x.dtype)
    got = _decode_step(model, x, impl, new)().double()
    with torch.no_grad():
        expected = ref.double()(torch.cat([x, new], dim=1).double())[:, -1:]
    err = ((got - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()
    return bool(err <= TOLERANCE[dtype_name]), err


def run_case(spec: dict[str, Any], model_override: torch.nn.Module | None = None) -> dict[str, Any]:
    """Run one case described by ``spec``; ``model_override`` lets tests inject an implementation."""
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    dtype = DTYPES[spec["dtype"]]
    b, t, d, h = spec["batch"], spec["seq"], spec["d_model"], spec["heads"]
    # The book's classes register a (context_length, context_length) mask buffer, so only they get
    # one as long as T; everything else is built from the same weights with a small buffer.
    context = t + 2 if spec["impl"].startswith("book-") else spec["check_len"] + 2
    model = model_override if model_override is not None else build(spec["impl"], reference_weights(d, h, context))
    model = model.to(dtype).eval()
    torch.manual_seed(1)
    x = torch.randn(b, t, d, dtype=dtype)
    result: dict[str, Any] = {**spec, "threads": torch.get_num_threads(), "torch": torch.__version__}

    check_x = x[:, : min(t, spec["check_len"])]
    reference = reference_weights(d, h, spec["check_len"] + 2)  # same weights; check() makes it float64
    ok, err = check(model, reference, check_x, spec["dtype"])
    what = "output"
    if ok and spec["mode"] == "forward+backward":  # what is timed is checked: the gradient too
        ok, err, what = (*check_backward(model, reference, check_x, spec["dtype"]), "input gradient")
    elif ok and spec["mode"] == "decode":  # and the decode step itself, cache and all
        ok, err, what = (*check_decode(model, reference, check_x, spec["dtype"], spec["impl"]), "decode step")
    result.update(agrees=ok, max_rel_error=err)
    if not ok:
        result["status"] = f"refused: its {what} differs from the reference"
        return result

    fn = _timed_call(model, x, spec["mode"], spec["impl"])
    median, samples = _median_seconds(fn, spec["repeats"], spec["warmup"])
    with PeakMemory() as mem:
        fn()
    result.update(
        status="ok",
        median_ms=median * 1e3,
        samples_ms=[s * 1e3 for s in samples],
        peak_allocated_bytes=mem.peak_bytes,
        peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    )
    return result


def _timed_call(model: torch.nn.Module, x: torch.Tensor, mode: str, impl: str) -> Callable[[], object]:
    """What one timed run does: a forward, a forward + backward, or one decode step."""
    if mode == "decode":
        return _decode_step(model, x, impl)
    if mode == "forward":

        def forward() -> object:
            with torch.no_grad():
                return model(x)

        return forward
    xg = x.detach().requires_grad_()

    def forward_backward() -> object:
        out = model(xg)
        out.sum().backward()
        return out

    return forward_backward


def time_interleaved(spec: dict[str, Any]) -> dict[str, Any]:
    """Time several implementations of one case in turns: round r runs each once, in an order rotated by r.

    A machine that slows down for a while slows every implementation in the
    rounds it touches, so the per-round ratios stay honest where timing each
    implementation in its own block would not.
    """
    torch.set_num_threads(spec.get("threads") or torch.get_num_threads())
    dtype = DTYPES[spec["dtype"]]
    b, t, d, h = spec["batch"], spec["seq"], spec["d_model"], spec["heads"]
    torch.manual_seed(1)
    x = torch.randn(b, t, d, dtype=dtype)
    calls = {}
    for impl in spec["impls"]:
        context = t + 2 if impl.startswith("book-") else spec["check_len"] + 2
        model = build(impl, reference_weights(d, h, context)).to(dtype).eval()
        calls[impl] = _timed_call(model, x, spec["mode"], impl)
    seconds = interleaved(calls, spec["repeats"], warmup=spec["warmup"])
    return {"samples_ms": {name: [s * 1e3 for s in taken] for name, taken in seconds.items()}}


def _decode_step(
    model: torch.nn.Module, x: torch.Tensor, impl: str, new: torch.Tensor | None = None
) -> Callable[[], torch.Tensor]:
    """One new token at position T: with a KVCache (attnlab) or by recomputing everything."""
    new = torch.randn_like(x[:, :1]) if new is None else new
    full = torch.cat([x, new], dim=1)  # (B, T+1, d)
    if impl.endswith("+kvcache"):
        if not isinstance(model, Attention):
            raise TypeError(f"{impl} needs an attnlab.Attention to make its cache, got {type(model).__name__}")
        cache = ModelCache.build([model.layer_state()], rows=x.shape[0], capacity=x.shape[1] + 1)[0]
        assert isinstance(cache, KVCache)  # the bench's modules have no window, so crop() rewinds it
        with torch.no_grad():
            model(x, cache=cache)

        def step() -> torch.Tensor:
            with torch.no_grad():
                out: torch.Tensor = model(new, cache=cache)
            cache.crop(x.shape[1])
            return out

        return step

    def recompute() -> torch.Tensor:
        with torch.no_grad():
            out: torch.Tensor = model(full)[:, -1:]
        return out

    return recompute


def matmul_gflops(repeats: int = 5, n: int = 2048, threads: int | None = None) -> float:
    """This machine's float32 matmul rate now: the practical roofline."""
    if threads:
        torch.set_num_threads(threads)
    a, b = torch.randn(n, n), torch.randn(n, n)
    median, _ = _median_seconds(lambda: a @ b, repeats, 2)
    return 2 * n**3 / median / 1e9


def limit_memory(max_bytes: int | None) -> None:
    """Cap this process's data segment, so a wrong memory prediction ends in a MemoryError, not the OOM killer."""
    if max_bytes:
        resource.setrlimit(resource.RLIMIT_DATA, (max_bytes, max_bytes))


def main() -> None:
    spec = json.loads(sys.argv[1])
    limit_memory(spec.get("memory_limit_bytes"))
    if spec.get("mode") == "matmul":
        print(json.dumps({"matmul_gflops": matmul_gflops(threads=spec.get("threads"))}))
        return
    if spec.get("mode") == "model":  # a whole GPT generating: attnlab.bench.models
        from attnlab.bench.models import model_case

        print(json.dumps(model_case(spec)))
        return
    if "impls" in spec:  # the interleaved timing of every implementation that passed its own case
        print(json.dumps(time_interleaved(spec)))
        return
    try:
        result = run_case(spec)
    except (MemoryError, RuntimeError) as err:  # torch reports a failed allocation as RuntimeError
        if "memory" not in str(err).lower() and not isinstance(err, MemoryError):
            raise
        result = {
            **spec,
            "status": f"failed: out of memory under the {spec.get('memory_limit_bytes', 0) / 2**30:.1f} GiB cap",
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
