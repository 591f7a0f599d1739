"""``attnlab generate --model PATH "prompt"``: a GPT checkpoint continues the prompt, token by token, as it goes."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console

from attnlab.cli._common import error, load_checkpoint

if TYPE_CHECKING:
    from attnlab.models import GPT

T = TypeVar("T")
# attnlab.cache.CACHES by name, here without importing torch for --help (tests/test_cache_lab.py compares them)
CACHE_NAMES = ("plain", "paged", "prefix", "sink", "int8", "int4", "h2o", "snapkv")


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    gen = sub.add_parser(
        "generate",
        help="continue a prompt with a GPT checkpoint (Hugging Face, the book's, attnlab's)",
        description="Continue a prompt with a GPT checkpoint (Hugging Face, the book's, attnlab's), "
        "printing each token as it is produced.",
    )
    gen.add_argument("prompt", help="the text to continue")
    gen.add_argument(
        "--model",
        required=True,
        metavar="PATH",
        help="a GPT-2 or attnlab directory, a book .pth, or a shipped model: 'induction', 'text'",
    )
    gen.add_argument("--tokenizer", metavar="DIR", help="where tokenizer.json (or vocab.json + merges.txt) is")
    gen.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens to add (default 50, or as many as the context has room for)",
    )
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default); higher is more random")
    gen.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    gen.add_argument("--top-p", type=float, help="sample among the most likely tokens that make up p")
    gen.add_argument("--seed", type=int, default=123, help="seed of the sampling (default 123)")
    gen.add_argument("--truncate", choices=["left"], help="drop the start of a prompt too long for the context")
    gen.add_argument("--backend", choices=["auto", "eager", "sdpa", "flash"], default="auto", help="attention backend")
    gen.add_argument(
        "--cache",
        choices=CACHE_NAMES,
        default="plain",
        help="the KV cache each layer keeps (the cache lab: docs/caches.md); 'sink' runs past the context with RoPE",
    )
    gen.add_argument(
        "--no-measure",
        action="store_true",
        help="skip the one-time measurement of this machine's fastest weight layouts and compile choice "
        "(what is kept is still used; as ATTNLAB_MEASURE=0)",
    )


def check_flags(args: argparse.Namespace) -> None:
    """The flags that need no model, each named as typed: --max-new-tokens, --temperature, --top-k, --top-p, --seed.
    The request's own checks (``Stop``, ``Sampling``), in the flags' words."""
    from attnlab._checks import check_positive_int, check_seed
    from attnlab.models.generation import Sampling, Stop

    if args.max_new_tokens is not None:
        check_positive_int("--max-new-tokens", args.max_new_tokens, limit=1_000_000)  # extra zeros are a typo
        in_flags(Stop, max_new_tokens=args.max_new_tokens)
    if not args.prompt.strip():
        raise ValueError(f"the prompt {args.prompt!r} is only whitespace; give some text to continue")
    greedy = in_flags(Sampling, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p).greedy
    for flag, value in (("--top-k", args.top_k), ("--top-p", args.top_p)):
        if value is not None and greedy:  # a flag that would change nothing is a slip
            raise ValueError(
                f"{flag} {value} samples, but --temperature {args.temperature:g} is greedy (always the most likely "
                f"token): give --temperature above 0 to sample, or leave out {flag}"
            )
    check_seed(args.seed, name="--seed")


def in_flags(make: Callable[..., T], **values: object) -> T:
    """``make(**values)``, its refusal worded with the flag in place of the parameter it names first."""
    try:
        return make(**values)
    except (ValueError, TypeError) as err:
        name, _, rest = str(err).partition(" ")
        raise type(err)(f"--{name.replace('_', '-')} {rest}" if name in values else str(err)) from None


def check_cache(model: GPT, cache: str) -> None:
    """--cache against the model, before any output: what the request checks (its layers' plan; nothing made),
    refused in the flag's words."""
    from attnlab.models.generation.request import planned

    try:
        planned(model, cache)
    except ValueError as err:
        window = model.config.window
        if window is None:
            raise ValueError(f"--cache {cache}: {err}") from None
        # on a windowed model the plain cache keeps the window's ring, paged and prefix its keys in blocks
        raise ValueError(
            f"--cache {cache} does not keep a sliding window's ring, and this model attends in a window of "
            f"{window} tokens: use --cache plain (a ring buffer of the window), or paged or prefix (its keys in "
            "blocks)"
        ) from None


def run(args: argparse.Namespace, console: Console) -> int:
    import torch

    from attnlab.cache import capabilities_of
    from attnlab.measured import measuring
    from attnlab.models.generation import Request, Sampling, Stop, decode
    from attnlab.models.generation.request import context_for
    from attnlab.models.generation.tuned import settle
    from attnlab.models.tokenizer import Decoder

    if args.no_measure:
        os.environ["ATTNLAB_MEASURE"] = "0"
    try:  # every flag before any output: those that need no model before it is read, then the rest against it
        check_flags(args)
        model, tokenizer = load_checkpoint(args.model, args.tokenizer, backend=args.backend)
        check_cache(model, args.cache)
    except (ValueError, TypeError) as err:
        return error(console, err)
    context = context_for(model, args.cache)  # None: a sink cache on a RoPE model, no context limit
    if context is not None and args.max_new_tokens is not None and args.max_new_tokens > context:
        return error(  # the prompt's last token and every new one but the last must fit: t + n - 1 <= context
            console,
            f"--max-new-tokens {args.max_new_tokens} is more than the model's context of {context} tokens, which "
            f"holds the prompt too: give --max-new-tokens {context} or fewer",
        )
    ids = tokenizer.encode(args.prompt)
    if not ids:
        return error(console, f"the prompt {args.prompt!r} has no tokens; give some text to continue")
    if args.max_new_tokens is None:  # 50, or what fits: the last new token is never fed back, so t + n - 1 <= context
        args.max_new_tokens = 50 if context is None else max(1, min(50, context + 1 - len(ids)))
    room = len(ids) if context is None else context + 1 - args.max_new_tokens
    if len(ids) > room:
        if args.truncate != "left":
            return error(
                console,
                f"the prompt has {len(ids)} tokens and --max-new-tokens is {args.max_new_tokens}: more than the "
                f"model's context of {context} tokens; shorten the prompt, lower --max-new-tokens, or pass --truncate left"
                + (
                    " (--cache sink runs past the context only for a model with rotary positions; this one learned "
                    "its positions, which end at its context)"
                    if capabilities_of(args.cache).past_context
                    else ""
                ),
            )
        ids = ids[-room:]
    if tokenizer.vocab_size > model.config.vocab_size:
        return error(
            console, f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {model.config.vocab_size}"
        )
    sampling = Sampling(
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=torch.Generator().manual_seed(args.seed),
    )
    request = Request(prompts=[ids], stop=Stop(max_new_tokens=args.max_new_tokens), sampling=sampling, cache=args.cache)
    try:  # checked against the model and its caches made at the call: before the prompt is printed
        passes = decode(model, settle(model, request, compile_named=False))
    except (ValueError, TypeError) as err:
        return error(console, err)
    decoder = Decoder(tokenizer)
    out = sys.stdout
    out.write(tokenizer.decode(ids))
    out.flush()
    for drawn in passes:
        for _, token in drawn:
            out.write(decoder.add(token))
            out.flush()
    out.write(decoder.flush() + "\n")
    if model.tuning is not None and not args.no_measure and measuring():  # what the default path chose here, and
        print(f"speed: {model.tuning.why}", file=sys.stderr)  # why: on stderr, beside the text
    return 0
