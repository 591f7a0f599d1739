"""The short causal convolution of the hybrid decoders (attnlab.functional.convolution): its fast form equals the
readable sum tap by tap, a text read in pieces equals the text read whole once the state is carried, and a layer's
StateCache keeps that state beside the recurrent one."""

from __future__ import annotations

import pytest
import torch

from attnlab.cache import ModelCache
from attnlab.functional.convolution import short_convolution, short_convolution_reference
from attnlab.nn.recurrent import GatedDeltaNet


@pytest.mark.parametrize("kernel", [1, 2, 4])
def test_the_fast_form_equals_the_sum_tap_by_tap(kernel: int) -> None:
    torch.manual_seed(0)
    x, weight = torch.randn(2, 9, 6), torch.randn(6, kernel)
    state = torch.randn(2, 6, kernel - 1)
    for given in (None, state):
        fast, fast_after = short_convolution(x, weight, state=given)
        slow, slow_after = short_convolution_reference(x, weight, state=given)
        torch.testing.assert_close(fast, slow)
        torch.testing.assert_close(fast_after, slow_after)
    # by hand, channel 0, token 0 with no state: only the last tap sees a real input
    out, _ = short_convolution_reference(x, weight)
    torch.testing.assert_close(out[:, 0, 0], weight[0, -1] * x[:, 0, 0])


def test_pieces_with_the_state_carried_equal_the_whole_and_without_it_do_not() -> None:
    torch.manual_seed(1)
    x, weight = torch.randn(1, 12, 4), torch.randn(4, 4)
    whole, _ = short_convolution(x, weight)
    first, state = short_convolution(x[:, :5], weight)
    rest, _ = short_convolution(x[:, 5:], weight, state=state)
    torch.testing.assert_close(torch.cat([first, rest], dim=1), whole)
    cold, _ = short_convolution(x[:, 5:], weight)  # the state dropped: the piece's first outputs change
    assert (cold[:, :3] - whole[:, 5:8]).abs().max() > 1e-3
    torch.testing.assert_close(cold[:, 3:], whole[:, 8:])  # past the kernel, the piece sees only its own inputs


def test_shapes_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match=r"weight must be \(channels=4, kernel size\), got \(3, 2\)"):
        short_convolution(torch.zeros(1, 2, 4), torch.zeros(3, 2))
    with pytest.raises(
        ValueError, match=r"state must be \(batch, channels, kernel - 1\) = \(1, 4, 1\), got \(1, 4, 3\)"
    ):
        short_convolution(torch.zeros(1, 2, 4), torch.zeros(4, 2), state=torch.zeros(1, 4, 3))


def test_a_gated_deltanet_with_a_convolution_decodes_as_it_reads_whole() -> None:
    """Grouped value heads and a convolution: token by token through its StateCache (which keeps the
    convolution's last inputs) equals the whole text at once; a cache without them is refused."""
    torch.manual_seed(2)
    layer = GatedDeltaNet(d_in=16, num_heads=2, head_dim=4, value_heads=4, value_dim=6, conv_kernel=3).eval()
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        whole = layer(x)
        cache = ModelCache.build([layer.layer_state()], rows=2, capacity=8)[0]
        steps = [layer(x[:, :3], cache=cache)] + [layer(x[:, t : t + 1], cache=cache) for t in range(3, 7)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=1e-5)
    assert layer.layer_state().conv == (2 * 2 * 4 + 4 * 6, 2) and cache.nbytes() == 4 * 2 * (
        4 * 4 * 6 + 40 * 2
    )  # float32: batch 2, states and inputs
    plain = GatedDeltaNet(d_in=16, num_heads=2, head_dim=4, value_heads=4, value_dim=6)
    without = ModelCache.build([plain.layer_state()], rows=2, capacity=8)[0]
    with torch.no_grad(), pytest.raises(ValueError, match=r"holds no convolution state; got \(2, 40, 2\)"):
        layer(x[:, :1], cache=without)
