"""Functions compiled by Inductor once and called without torch.compile's guards, and attnlab's own ops.

:func:`compiled` traces a function with make_fx on fake tensors and hands the graph to Inductor, once per key
that names everything the function is specialized to; a call then costs microseconds, not a guard check.
Inductor wraps the compiled graph's runner in AOTAutograd's and Dynamo's runtime wrappers, for graphs that need
gradients, mutate their inputs or return views; the graphs compiled here do none of that, so :func:`_direct`
calls the runner itself once a first call gave the wrapped call's numbers bitwise.

:func:`define_cpu_op` registers an op that attnlab's torch.compile graphs call without looking inside
(``attnlab::gemv``, ``attnlab::prefetch_gemv``, ...), at the dispatcher's CPU key alone, with no backward:
:func:`refuse_gradient` refuses by name a call that needs one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

KERNELS: dict[object, Callable[..., Any]] = {}  # one compiled kernel per (key, contraction), made on first use


def compiled(
    key: object, fn: Callable[..., Any], inputs: list[torch.Tensor], *, contract: bool = False
) -> Callable[..., Any]:
    """``fn`` traced with make_fx on fake tensors like ``inputs`` and compiled by Inductor (no Dynamo, so a call
    costs microseconds, not a guard check; ``fn`` must not write its inputs: its first call may run twice, see
    :func:`_direct`), made once per ``key``, which names everything it is specialized to (a
    :func:`attnlab.linear.gemv.kernel_spec`): the caller hands it tensors of that spec only. ``contract``: the C++
    compiler may fuse a product and a sum into one fma (-ffp-contract=fast), as eager's addcmul and fbgemm round
    them."""
    made = (key, contract)  # a kernel compiled with contraction is never handed out for one without, or back
    if made not in KERNELS:
        import torch._inductor.config as inductor_config
        from torch._inductor import compile as inductor_compile
        from torch.fx.experimental.proxy_tensor import make_fx

        graph = make_fx(fn, tracing_mode="fake")(*inputs)  # on fake tensors: gemv's (N, out, in) is never formed
        flags: dict[str, object] = {}
        if contract and hasattr(inductor_config.cpp, "enable_floating_point_contract_flag"):  # not in older torch:
            # there the kernel is compiled as it comes, and the callers' bitwise probes set it aside
            flags = {"cpp.enable_floating_point_contract_flag": "fast", "cpp.enable_unsafe_math_opt_flag": False}
        with inductor_config.patch(flags):
            built = inductor_compile(graph, list(inputs))
        KERNELS[made] = _direct(built)
    return KERNELS[made]


def _direct(built: Callable[..., Any]) -> Callable[..., Any]:
    """``built`` (Inductor's compiled callable), called through the compiled graph's own runner where one is
    found and, on the first call, gives ``built``'s numbers bitwise; ``built`` itself elsewhere (another torch).
    Inductor wraps its runner in AOTAutograd's and Dynamo's runtime wrappers, for graphs that need gradients,
    mutate their inputs or return views; these graphs do none of that, and the wrappers cost about 5 µs a call
    (timed on the machine of docs/benchmarks.md), some 0.25 ms a decode step of gpt2-small's 49 products. Under
    the profiler the wrapped call runs, so that a trace names each compiled product ("## Call CompiledFxGraph")."""
    runner = _runner(built)
    if runner is None:
        return built
    trusted: list[bool] = []  # (agrees, returns one tensor): empty until a first call outside the profiler

    def call(*args: torch.Tensor) -> Any:
        if not trusted or not trusted[0] or torch.autograd.profiler._is_profiler_enabled:
            want = built(*args)
            if not trusted and not torch.autograd.profiler._is_profiler_enabled:
                try:
                    agrees = _same(want, runner(list(args)))
                except Exception:  # a runner this torch calls otherwise: the wrapped call, from now on
                    agrees = False
                trusted[:] = [agrees, isinstance(want, torch.Tensor)]
            return want
        out = runner(list(args))  # the runner empties the list it is handed
        return out[0] if trusted[1] else tuple(out)

    return call


def _same(want: Any, got: Any) -> bool:
    """Whether the runner's outputs (a list) are ``built``'s (a tensor, or a tuple of them), equal in every number
    (torch.equal: a NaN is never equal, so a first call that meets one leaves the wrapped call: slower, not wrong)."""
    wanted = [want] if isinstance(want, torch.Tensor) else list(want)
    return len(wanted) == len(got) and all(
        isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
        for a, b in zip(wanted, got, strict=True)
    )


def _runner(built: Callable[..., Any]) -> Callable[[list[torch.Tensor]], Any] | None:
    """The runner of the compiled graph inside ``built`` (its ``current_callable``, which takes a list of inputs),
    found through the wrappers' closures; None where this torch nests it otherwise."""
    try:
        from torch._inductor.output_code import CompiledFxGraph
    except ImportError:  # a torch before 2.6 keeps it elsewhere: its callable as it comes
        return None

    todo: list[object] = [built]
    seen: set[int] = set()
    while todo:
        fn = todo.pop()
        if id(fn) in seen or len(seen) > 64:
            continue
        seen.add(id(fn))
        if isinstance(fn, CompiledFxGraph):
            runner = fn.current_callable
            return runner if callable(runner) else None
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                todo.append(cell.cell_contents)
            except ValueError:  # an empty cell
                continue
    return None


_LIBRARY = torch.library.Library("attnlab", "FRAGMENT")  # the ops attnlab's torch.compile graphs call


def define_cpu_op(
    name: str, schema: str, kernel: Callable[..., torch.Tensor], fake: Callable[..., torch.Tensor]
) -> None:
    """Define the op ``attnlab::<name><schema>``, which a torch.compile graph calls without looking inside: run by
    ``kernel`` on the CPU, planned for by ``fake``. It is registered at the dispatcher's CPU key alone: a call
    cost about 2 µs over its kernel, against about 40 through ``torch.library.custom_op``'s autograd and
    wrappers (timed on the machine of docs/benchmarks.md; a decode step makes 49). So it has no backward: its
    callers put it in a graph only when no gradient is wanted, and ``kernel`` refuses a call that needs one
    (:func:`refuse_gradient`)."""
    _LIBRARY.define(name + schema)
    _LIBRARY.impl(name, kernel, "CPU")
    torch.library.register_fake(f"attnlab::{name}", fake, lib=_LIBRARY)


def refuse_gradient(op: str, *tensors: torch.Tensor | None) -> None:
    """Refuse, by name, a call of an op without a backward on tensors that need a gradient: autograd's fallback
    would only warn, and the gradient would be missing."""
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors):
        raise RuntimeError(
            f"attnlab::{op} has no backward, and was called on tensors that need a gradient; multiply with "
            "F.linear to train (the layouts and Int8Linear do so by themselves)"
        )
