"""``attnlab generate --model PATH "prompt"``: a GPT checkpoint continues the prompt, token by token, as it goes."""

from __future__ import annotations

import argparse
import sys

from rich.console import Console

from attnlab.cli._common import error, load_checkpoint

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


def run(args: argparse.Namespace, console: Console) -> int:
    import torch

    from attnlab._checks import check_positive_int, check_seed
    from attnlab.models.generate import check_sampling
    from attnlab.models.tokenizer import Decoder

    try:  # every argument before the model is read
        if args.max_new_tokens is not None:
            check_positive_int("--max-new-tokens", args.max_new_tokens, limit=1_000_000)
        check_sampling(args.temperature, args.top_k, args.top_p)
        check_seed(args.seed, name="--seed")
        model, tokenizer = load_checkpoint(args.model, args.tokenizer, backend=args.backend)
    except (ValueError, TypeError) as err:
        return error(console, err)
    ids = tokenizer.encode(args.prompt)
    context = model.config.context_length
    if not ids:
        return error(console, f"the prompt {args.prompt!r} has no tokens; give some text to continue")
    endless = model.positions_for(args.cache) is None  # a sink cache on a RoPE model: no context limit
    if args.max_new_tokens is None:  # 50, or what fits: the last new token is never fed back, so t + n - 1 <= context
        args.max_new_tokens = 50 if endless else max(1, min(50, context + 1 - len(ids)))
    room = len(ids) if endless else context + 1 - args.max_new_tokens
    if len(ids) > room:
        if args.truncate != "left" or room < 1:
            return error(
                console,
                f"the prompt has {len(ids)} tokens and --max-new-tokens is {args.max_new_tokens}: more than the "
                f"model's context of {context} tokens; shorten the prompt, lower --max-new-tokens, or pass --truncate left"
                + (
                    " (--cache sink runs past the context only for a model with rotary positions; this one learned "
                    "its positions, which end at its context)"
                    if args.cache == "sink"
                    else ""
                ),
            )
        ids = ids[-room:]
    if tokenizer.vocab_size > model.config.vocab_size:
        return error(
            console, f"the tokenizer has {tokenizer.vocab_size} tokens but the model only {model.config.vocab_size}"
        )
    generator = torch.Generator().manual_seed(args.seed)
    decoder = Decoder(tokenizer)
    out = sys.stdout
    out.write(tokenizer.decode(ids))
    out.flush()
    for token in model.stream(
        torch.tensor([ids]),
        args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        generator=generator,
        cache=args.cache,
    ):
        out.write(decoder.add(int(token)))
        out.flush()
    out.write(decoder.flush() + "\n")
    return 0
