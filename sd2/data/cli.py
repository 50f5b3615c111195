"""`sd2 data ...`: build the held-out prompt sets, answer training prompts with the verifier, pack shards.

`sd2.cli` calls `add_data_parser(sub)`; each subcommand's function takes the parsed args and
returns an exit code. Heavy imports happen inside the functions, so `sd2 --help` stays fast.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from sd2.cli_args import add_placement_arguments

log = logging.getLogger(__name__)

SOURCES = ("sharegpt", "pydocs", "pydocs-explain")  # pydocs: summarise a paragraph; -explain: explain it


def add_data_parser(sub: argparse._SubParsersAction) -> None:
    """Register `data synth`, `prompt-sets`, `shards` and `draft-vocab` under the `sd2` parser."""
    data = sub.add_parser("data", help="prompt sets, synthetic data, tokenised shards, draft vocabularies")
    data_sub = data.add_subparsers(dest="data_command", required=True)
    _add_synth(data_sub)
    _add_prompt_sets(data_sub)
    _add_shards(data_sub)
    _add_draft_vocab(data_sub)


def _add_draft_vocab(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "draft-vocab",
        help="the N tokens the verifier emits most, stored as draft_vocab.json in drafter folders",
    )
    p.add_argument("synth_files", type=Path, nargs="+", help="`sd2 data synth` outputs (training prompts)")
    p.add_argument("--size", type=int, required=True, help="N, the number of tokens kept")
    p.add_argument(
        "--into", type=Path, nargs="+", required=True, metavar="DRAFTER", help="drafter folders to write to"
    )
    p.add_argument(
        "--fallback-conversations",
        type=int,
        default=2000,
        help="training ShareGPT conversations whose recorded replies rank tokens the answers never show",
    )
    p.add_argument("--verifier", default=None, help="whose tokenizer and stop ids (default: embedded)")
    p.set_defaults(func=draft_vocab_main)


def draft_vocab_main(args: argparse.Namespace) -> int:
    """`sd2 data draft-vocab`: rank, keep --size, write into every --into folder."""
    from sd2.data.draft_vocab_build import ranked_vocab, recorded_replies, synth_answers
    from sd2.models import load_tokenizer, resolve_model_path

    missing = [str(d) for d in args.into if not (d / "config.json").is_file()]
    if missing:
        raise ValueError(f"--into must name drafter folders (with config.json): {', '.join(missing)}")
    tokenizer = load_tokenizer(resolve_model_path(args.verifier))
    answers = list(synth_answers(args.synth_files))
    files = ", ".join(p.name for p in args.synth_files)
    source = (
        f"verifier answers to {len(answers)} training prompts ({files}), "
        f"then recorded replies of {args.fallback_conversations} training conversations"
    )
    stops = [t for t in (tokenizer.eos_token_id, tokenizer.pad_token_id) if t is not None]
    vocab = ranked_vocab(
        answers, recorded_replies(tokenizer, args.fallback_conversations), args.size, stops, source
    )
    for folder in args.into:
        print(vocab.save(folder))
    print(f"{vocab.size} tokens, {vocab.coverage:.4f} of the answers' tokens")
    return 0


def _add_synth(sub: argparse._SubParsersAction) -> None:
    from sd2.data.synth import TURNS, SynthConfig

    d = SynthConfig()
    p = sub.add_parser("synth", help="the verifier answers training prompts (resumable JSONL)")
    p.add_argument(
        "--source",
        choices=SOURCES,
        default="sharegpt",
        help="prompt corpus: ShareGPT user turns, or Python-docs paragraphs to summarise or explain",
    )
    p.add_argument(
        "--turns",
        choices=TURNS,
        default="first",
        help="ShareGPT: the opening user turn of each conversation, every user turn with the "
        "conversation so far, or every user turn but the opening one (disjoint from a 'first' file)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=1,
        help="answers per prompt (T > 0 only), ids <id>~0 … <id>~N-1",
    )
    p.add_argument("--split", choices=("train", "validation"), default="train", help="never the test split")
    p.add_argument("--limit", type=int, default=None, help="answer at most this many prompts (the first N)")
    p.add_argument(
        "--skip",
        type=int,
        default=0,
        help="start after the first N prompts (e.g. the ones an earlier --limit N run answered)",
    )
    p.add_argument("--out", type=Path, default=None, help="JSONL (default: SD2_HOME/data/synth/<name>.jsonl)")
    p.add_argument(
        "--verifier", default=None, help="hub id or folder (default: embedded SmolLM2-135M-Instruct)"
    )
    p.add_argument(
        "--answerer",
        type=Path,
        default=None,
        metavar="DRAFTER",
        help="a drafter folder answers instead of the verifier (unsteered, its full vocabulary): "
        "on-policy data, whose verifier distributions distillation computes as it trains",
    )
    add_placement_arguments(p)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens)
    p.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens)
    p.add_argument(
        "--temperature", type=float, default=d.temperature, help="0 = greedy; top_p=1, top_k=0 always"
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument(
        "--sort-batches",
        type=int,
        default=d.sort_batches,
        help="cut batches from groups of N·batch-size prompts sorted by length (less padding); "
        "0 = batch the prompts as given (files written before this option)",
    )
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=d.max_batch_tokens,
        help="at most this many rows × (longest prompt + max new tokens) per batch, so long prompts run "
        "in fewer rows (0 = no limit, as files written before this option)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (1 is far faster on a CPU shared with other jobs)",
    )
    p.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    p.set_defaults(func=synth_main)


def _add_prompt_sets(sub: argparse._SubParsersAction) -> None:
    from sd2.data.prompt_sets import PROMPT_SETS, PromptSetConfig

    d = PromptSetConfig()
    p = sub.add_parser("prompt-sets", help="(re)build the held-out evaluation prompt sets in assets/prompts")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the JSONL files and README (default: the assets' prompts/)",
    )
    p.add_argument("--count", type=int, default=d.count, help="prompts per set")
    p.add_argument("--max-prompt-tokens", type=int, default=d.max_prompt_tokens)
    p.add_argument("--set", dest="sets", action="append", choices=PROMPT_SETS, help="only these sets")
    p.add_argument("--verifier", default=None, help="whose tokenizer counts tokens (default: embedded)")
    p.set_defaults(func=prompt_sets_main)


def _add_shards(sub: argparse._SubParsersAction) -> None:
    from sd2.data.shards import ShardConfig

    d = ShardConfig()
    p = sub.add_parser("shards", help="pack a synth JSONL into cached token shards; prints the folder")
    p.add_argument("synth_file", type=Path, help="output of `sd2 data synth`")
    p.add_argument("--seq-len", type=int, default=d.seq_len)
    p.add_argument("--verifier", default=None, help="whose tokenizer the ids belong to (default: embedded)")
    p.set_defaults(func=shards_main)


def _tokenizer(verifier: str | None):
    from sd2.models import load_tokenizer, resolve_model_path

    return load_tokenizer(resolve_model_path(verifier))


def synth_main(args: argparse.Namespace) -> int:
    """`sd2 data synth`: answer the first user turns of a training split with the verifier (or, with
    --answerer, with a drafter: its own samples, the on-policy data of DistillSpec)."""
    import torch

    from sd2.data.synth import SynthConfig, prompt_window, run_synth, synth_prompts
    from sd2.engine import Engine
    from sd2.paths import repo_relative, sd2_home

    if args.threads:
        torch.set_num_threads(args.threads)

    if args.samples < 1:
        raise ValueError(f"--samples must be ≥ 1, got {args.samples}")
    if args.samples > 1 and args.temperature == 0:
        raise ValueError("--samples > 1 needs --temperature > 0: greedy answers are all the same")
    config = SynthConfig(
        args.max_new_tokens,
        args.temperature,
        args.batch_size,
        args.seed,
        args.max_prompt_tokens,
        args.sort_batches,
        args.max_batch_tokens,
    )
    # transformers' own kernels: the batch-invariant ones matter for speculative decoding only, and cost
    # batched generate ≈ 1.3× at 128 rows (benchmarks/synth_rate.py)
    answerer = {"answerer": str(args.answerer)} if args.answerer else {}  # checked to fit the verifier
    engine = Engine.load(
        args.verifier,
        answerer,
        device=args.device,
        shipped=False,
        dtype=args.dtype,
        batch_invariant=False,
        draft_weights="full",  # an answerer's text comes from its own weights
    )
    prompts = synth_prompts(
        training_pool(args.source, args.split),
        engine.tokenizer,
        config.max_prompt_tokens,
        turns=args.turns,
        samples=args.samples,
    )
    prompts = prompt_window(prompts, args.skip, args.limit)
    verifier = engine.verifier_name.replace("/", "--")
    variant = (f"-{args.turns}turns" if args.turns != "first" else "") + (
        f"-x{args.samples}" if args.samples > 1 else ""
    )
    by = f"-by-{args.answerer.resolve().name}" if args.answerer else ""
    name = f"{verifier}-{args.source}-{args.split}{variant}{by}-T{config.temperature:g}-s{config.seed}"
    out = args.out or sd2_home() / "data" / "synth" / f"{name}.jsonl"
    meta = {
        "verifier": engine.verifier_name,
        "source": args.source,
        "split": args.split,
        "turns": args.turns,
        "samples": args.samples,
        "precision": engine.placement.precision,  # answers of one file come from one precision
    }
    if args.answerer:  # only then: files of the verifier's answers resume with the settings they have
        meta["answerer"] = repo_relative(str(args.answerer))
    written = run_synth(
        engine.drafters["answerer"].model if args.answerer else engine.verifier,
        engine.tokenizer,
        prompts,
        out,
        config,
        engine.stop_ids,
        meta=meta,
        progress=not args.no_progress,
    )
    log.info("synth: wrote %d new rows to %s", written, out)
    print(out)
    return 0


def training_pool(source: str, split: str):
    """The conversations of a corpus's train or validation split (never test), as synth reads them."""
    from sd2.data.pydocs import EXPLAIN_TEMPLATE, SUMMARIZE_TEMPLATE, docs_paragraphs
    from sd2.data.sharegpt import sharegpt_conversations
    from sd2.data.split import default_split, select, train_only

    if source == "sharegpt":
        conversations = sharegpt_conversations()
    else:
        template = EXPLAIN_TEMPLATE if source == "pydocs-explain" else SUMMARIZE_TEMPLATE
        conversations = docs_paragraphs(template=template)
    config = default_split(source)
    return (
        train_only(conversations, config) if split == "train" else list(select(conversations, split, config))
    )


def prompt_sets_main(args: argparse.Namespace) -> int:
    """`sd2 data prompt-sets`: rebuild assets/prompts/{chat,code,summarize}.jsonl and their README."""
    from sd2.data.prompt_sets import PROMPT_SETS, PromptSetConfig, build_prompt_sets
    from sd2.embedded import EMBEDDED_VERIFIER
    from sd2.paths import prompts_dir

    config = PromptSetConfig(count=args.count, max_prompt_tokens=args.max_prompt_tokens)
    out = args.out or prompts_dir()
    built = build_prompt_sets(
        _tokenizer(args.verifier),
        out,
        config,
        args.verifier or EMBEDDED_VERIFIER,
        names=args.sets or PROMPT_SETS,
    )
    for name, records in built.items():
        print(f"{name}: {len(records)} prompts → {out / (name + '.jsonl')}")
    return 0


def shards_main(args: argparse.Namespace) -> int:
    """`sd2 data shards FILE`: pack verifier answers into cached shards; print the folder."""
    import hashlib

    from sd2.data.examples import synth_examples
    from sd2.data.shards import ShardConfig, cached_shards

    if not args.synth_file.is_file():
        raise FileNotFoundError(f"no synth file {args.synth_file}: run `sd2 data synth` first")
    digest = hashlib.sha256(args.synth_file.read_bytes()).hexdigest()
    source = {"kind": "synth", "file": args.synth_file.name, "sha256": digest}
    folder = cached_shards(
        args.synth_file.stem,
        lambda: synth_examples(args.synth_file),
        _tokenizer(args.verifier),
        ShardConfig(seq_len=args.seq_len),
        source,
    )
    print(folder)
    return 0
