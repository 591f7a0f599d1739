"""A call that fails halfway through the layers leaves every layer's state as it was before it (issue 57).

The failure is made real: a hook on a middle block raises (an error, or Ctrl-C) after the layers before it wrote
(a convolution, a sliding ring that wraps, a Gated DeltaNet and a KDA state, on ``every_kind()``). Oracle: what
each layer holds before the call (``test_going_back.held``: a state's tensors, a ring's window, a full cache's
filled slots), compared bitwise after it; then the next call gives what a cache that never saw the failure gives.
A cache whose writes cannot be undone (sink, int8: they reshape what they hold) refuses to go on, by name, once a
failed call wrote into it, and goes on where the failure came before any write.
"""

from __future__ import annotations

import pytest
import torch

from attnlab.cache import PrefixCache
from attnlab.models.gpt import GPT
from test_going_back import every_kind, held

IDS = torch.randint(0, 64, (1, 24), generator=torch.Generator().manual_seed(3))


def fail_at(m: GPT, block: int, error: BaseException) -> torch.utils.hooks.RemovableHandle:
    def raise_it(*_: object) -> None:
        raise error

    return m.blocks[block].register_forward_pre_hook(raise_it)


@pytest.mark.parametrize("error", [RuntimeError("injected"), KeyboardInterrupt()])
@torch.no_grad()
def test_a_call_failing_after_four_layers_wrote_leaves_every_layer_as_it_was(error: BaseException) -> None:
    m = every_kind()
    cache, fresh = m.make_caches(batch_size=1, max_len=64), m.make_caches(batch_size=1, max_len=64)
    for c in (cache, fresh):
        m(IDS[:, :10], caches=c)
    before = [t.clone() for t in held(cache)]
    hook = fail_at(m, 4, error)  # conv, sliding (window 4: the 6 tokens wrap its ring), delta and kda wrote
    with pytest.raises(type(error)):
        m(IDS[:, 10:16], caches=cache)
    hook.remove()
    assert all(torch.equal(a, b) for a, b in zip(held(cache), before, strict=True))
    assert torch.equal(m(IDS[:, 10:16], caches=cache), m(IDS[:, 10:16], caches=fresh))


@torch.no_grad()
def test_a_prefix_cache_kept_across_calls_is_whole_after_a_generation_fails_halfway() -> None:
    m = every_kind()
    store = PrefixCache.for_model(m, batch_size=1, max_len=96)
    first, second = IDS[:, :20], torch.cat([IDS[:, :16], IDS[:, 20:]], dim=1)
    m.generate(first, 6, cache=store)
    kept, tokens = store.kept_nbytes(), store.cached_tokens()
    calls = 0

    def third_call_fails(*_: object) -> None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("injected")

    hook = m.blocks[3].register_forward_pre_hook(third_call_fails)
    with pytest.raises(RuntimeError, match="injected"):
        m.generate(second, 6, cache=store)
    hook.remove()
    assert (store.kept_nbytes(), store.cached_tokens()) == (kept, tokens)  # the tree holds what it held
    assert all(not held_blocks for held_blocks in store.blocks.held) and store.blocks.pending is None
    assert torch.equal(m.generate(second, 6, cache=store), m.generate(second, 6))


@pytest.mark.parametrize("name", ["sink", "int8"])
@torch.no_grad()
def test_a_cache_that_cannot_undo_refuses_to_go_on_after_a_failure_that_wrote(name: str) -> None:
    m = every_kind(layer_types=("full", "full", "full"), n_layers=3)
    cache = m.make_caches(batch_size=1, max_len=64, cache=name)
    m(IDS[:, :8], caches=cache)
    hook = fail_at(m, 0, RuntimeError("before any write"))
    with pytest.raises(RuntimeError):
        m(IDS[:, 8:10], caches=cache)
    hook.remove()
    m(IDS[:, 8:10], caches=cache)  # nothing was written: it goes on
    hook = fail_at(m, 2, RuntimeError("after two layers wrote"))
    with pytest.raises(RuntimeError):
        m(IDS[:, 10:12], caches=cache)
    hook.remove()
    kind = {"sink": "SinkCache", "int8": "QuantizedKVCache"}[name]
    with pytest.raises(
        ValueError, match=f"a call failed halfway through this cache, and its {kind} layers cannot undo"
    ):
        m(IDS[:, 10:12], caches=cache)


@torch.no_grad()
def test_a_failed_call_on_a_prefix_cache_keeps_no_state_at_a_block_end_it_reached() -> None:
    """The layers before the failure wrote 16 tokens, a block's end, and kept their states there: undone, those go
    (the tree would otherwise take them for a block whose tokens were never written)."""
    from attnlab.cache.undo import passing

    m = every_kind()
    store = PrefixCache.for_model(m, batch_size=1, max_len=64)
    store.admit(0, IDS[0, :16].tolist(), total=20)
    hook = fail_at(m, 4, RuntimeError("injected"))
    with pytest.raises(RuntimeError), passing(store):
        m.step(IDS[:, :16], torch.arange(16)[None], store.views([0]))
    hook.remove()
    assert store.blocks.length == [0] and all(state.ends[0] == {} for state in store.states)
    assert all(not t.any() for state in store.states for t in state._tensors())  # the row's states: zeros again
