import json

import pytest
import torch

from sd2.data.records import Conversation, Provenance
from sd2.data.synth import SynthConfig, done_ids, generation_config, plan_batches, run_synth, synth_prompts
from tests.tiny import tiny_llama, tiny_tokenizer

PROV = Provenance("t", "t", "0", "f")
STOP = [2]  # <|im_end|> in the tiny tokenizer


@pytest.fixture(scope="module")
def pair():
    return tiny_llama(), tiny_tokenizer()


def prompts(tokenizer, n=5):
    convs = [
        Conversation(f"c{i}", ({"role": "user", "content": f"Tell me a story about cat {i}"},), PROV)
        for i in range(n)
    ]
    return synth_prompts(convs, tokenizer, max_prompt_tokens=256)


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_interrupted_run_resumes_without_duplicates_and_matches_a_full_run(pair, tmp_path):
    model, tokenizer = pair
    config = SynthConfig(max_new_tokens=8, temperature=1.0, batch_size=2, seed=3)
    todo = prompts(tokenizer)
    out = tmp_path / "resumed.jsonl"
    assert (
        run_synth(model, tokenizer, todo, out, config, STOP, max_batches=1, progress=False) == 2
    )  # "interrupt"
    assert [r["id"] for r in rows(out)] == ["c0", "c1"]
    assert run_synth(model, tokenizer, todo, out, config, STOP, progress=False) == 3
    assert run_synth(model, tokenizer, todo, out, config, STOP, progress=False) == 0  # nothing left
    resumed = rows(out)
    assert [r["id"] for r in resumed] == [f"c{i}" for i in range(5)]
    full = tmp_path / "full.jsonl"
    run_synth(model, tokenizer, todo, full, config, STOP, progress=False)
    assert rows(full) == resumed  # resuming changes nothing: samples depend on (seed, batch ids) only
    other = tmp_path / "other-seed.jsonl"
    run_synth(model, tokenizer, todo, other, SynthConfig(8, 1.0, 2, seed=4), STOP, progress=False)
    assert [r["response_ids"] for r in rows(other)] != [r["response_ids"] for r in resumed]
    for row, prompt in zip(resumed, todo, strict=True):
        assert row["prompt_ids"] == list(prompt.prompt_ids)
        assert 0 < len(row["response_ids"]) <= 8
        assert (row["finish_reason"] == "stop") == (row["response_ids"][-1] in STOP)
        assert all(t not in STOP for t in row["response_ids"][:-1])  # cut right after the first stop


def test_greedy_rows_match_unbatched_greedy(pair, tmp_path):
    model, tokenizer = pair
    todo = prompts(tokenizer, n=3)
    out = tmp_path / "greedy.jsonl"
    run_synth(
        model,
        tokenizer,
        todo,
        out,
        SynthConfig(max_new_tokens=6, temperature=0.0, batch_size=3),
        STOP,
        progress=False,
    )
    for row, prompt in zip(rows(out), todo, strict=True):
        ids = torch.tensor([prompt.prompt_ids])
        single = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=6,
            eos_token_id=STOP,
            pad_token_id=2,
        )[0, ids.shape[1] :].tolist()
        assert row["response_ids"] == single[: len(row["response_ids"])]  # left padding changes nothing


def test_torn_last_line_is_dropped_and_regenerated(pair, tmp_path):
    model, tokenizer = pair
    config = SynthConfig(max_new_tokens=4, batch_size=2)
    out = tmp_path / "torn.jsonl"
    run_synth(model, tokenizer, prompts(tokenizer, 2), out, config, STOP, progress=False)
    out.write_text(out.read_text() + '{"id": "c9", "prompt')  # a crash mid-write
    assert done_ids(out) == {"c0", "c1"}
    assert out.read_text().endswith("\n")


def test_resume_with_other_settings_is_refused(pair, tmp_path):
    model, tokenizer = pair
    out = tmp_path / "meta.jsonl"
    run_synth(
        model, tokenizer, prompts(tokenizer, 2), out, SynthConfig(max_new_tokens=4), STOP, progress=False
    )
    with pytest.raises(ValueError, match="temperature"):
        run_synth(
            model,
            tokenizer,
            prompts(tokenizer, 2),
            out,
            SynthConfig(max_new_tokens=4, temperature=0.5),
            STOP,
            progress=False,
        )


def test_sampling_ignores_the_models_own_top_p_top_k(pair):
    model, _ = pair
    model.generation_config.update(top_k=5, top_p=0.5, repetition_penalty=1.5, do_sample=True)
    try:
        merged, _ = model._prepare_generation_config(generation_config(SynthConfig(), STOP, 2))
        processors = model._get_logits_processor(
            generation_config=merged,
            input_ids_seq_length=4,
            encoder_input_ids=None,
            prefix_allowed_tokens_fn=None,
            logits_processor=None,
            device="cpu",
        )
    finally:
        model.generation_config.update(top_k=50, top_p=1.0, repetition_penalty=1.0, do_sample=False)
    assert (merged.top_k, merged.top_p, merged.repetition_penalty) == (0, 1.0, 1.0)
    scores = torch.randn(2, 320)  # [B, V]
    input_ids = torch.randint(3, 320, (2, 4))  # [B, T]
    assert torch.equal(processors(input_ids, scores.clone()), scores)  # pure T = 1: logits untouched


def test_too_long_prompts_are_skipped_not_truncated(pair):
    _, tokenizer = pair
    convs = [
        Conversation("short", ({"role": "user", "content": "hi"},), PROV),
        Conversation("long", ({"role": "user", "content": "cat " * 200},), PROV),
        Conversation("bot-first", ({"role": "assistant", "content": "hello"},), PROV),
    ]
    kept = synth_prompts(convs, tokenizer, max_prompt_tokens=32)
    assert [p.id for p in kept] == ["short"]
    assert tokenizer.decode(kept[0].prompt_ids).endswith("<|im_start|>assistant\n")


def test_all_turns_gives_every_user_turn_with_the_conversation_so_far(pair):
    _, tokenizer = pair
    conv = Conversation(
        "chat",
        (
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "name a cat"},
            {"role": "assistant", "content": "Tom"},
            {"role": "user", "content": "another"},
            {"role": "assistant", "content": "Felix"},
        ),
        PROV,
    )
    first = synth_prompts([conv], tokenizer, max_prompt_tokens=256)
    every = synth_prompts([conv], tokenizer, max_prompt_tokens=256, turns="all")
    assert [p.id for p in first] == ["chat"]
    assert [p.id for p in every] == ["chat", "chat@3"]  # the opening turn keeps the bare id
    later = tokenizer.decode(every[1].prompt_ids)
    assert "name a cat" in later and "Tom" in later and "another" in later and "Felix" not in later
    assert later.endswith("<|im_start|>assistant\n")
    rest = synth_prompts([conv], tokenizer, max_prompt_tokens=256, turns="later")
    assert [(p.id, p.prompt_ids) for p in rest] == [(every[1].id, every[1].prompt_ids)]  # disjoint from first
    with pytest.raises(ValueError, match="turns"):
        synth_prompts([conv], tokenizer, max_prompt_tokens=256, turns="last")


def test_several_samples_per_prompt_get_their_own_ids_and_draws(pair, tmp_path):
    model, tokenizer = pair
    convs = [Conversation("c0", ({"role": "user", "content": "Tell me a story about a cat"},), PROV)]
    todo = synth_prompts(convs, tokenizer, max_prompt_tokens=256, samples=3)
    assert [p.id for p in todo] == ["c0~0", "c0~1", "c0~2"]
    assert len({p.prompt_ids for p in todo}) == 1
    out = tmp_path / "samples.jsonl"
    run_synth(model, tokenizer, todo, out, SynthConfig(max_new_tokens=12, batch_size=3), STOP, progress=False)
    answers = [tuple(r["response_ids"]) for r in rows(out)]
    assert len(set(answers)) == 3  # one prompt, three different T = 1 samples
    with pytest.raises(ValueError, match="samples"):
        synth_prompts(convs, tokenizer, max_prompt_tokens=256, samples=0)


def test_batches_are_cut_from_length_sorted_groups(pair):
    _, tokenizer = pair
    convs = [
        Conversation(f"c{i}", ({"role": "user", "content": "word " * n},), PROV)
        for i, n in enumerate([9, 1, 5, 1, 7, 3, 2])
    ]
    todo = synth_prompts(convs, tokenizer, max_prompt_tokens=256)
    ids = [[p.id for p in b] for b in plan_batches(todo, SynthConfig(batch_size=2, sort_batches=2))]
    # groups of 4 prompts sorted by length (ties in order), then cut into batches of 2
    assert ids == [["c1", "c3"], ["c2", "c0"], ["c6", "c5"], ["c4"]]
    assert [[p.id for p in b] for b in plan_batches(todo, SynthConfig(batch_size=2, sort_batches=0))] == [
        ["c0", "c1"],
        ["c2", "c3"],
        ["c4", "c5"],
        ["c6"],
    ]


def test_sorted_runs_resume_and_older_unsorted_files_resume_with_sorting_off(pair, tmp_path):
    model, tokenizer = pair
    convs = [
        Conversation(f"c{i}", ({"role": "user", "content": "tell " * n},), PROV)
        for i, n in enumerate([6, 1, 4])
    ]
    todo = synth_prompts(convs, tokenizer, max_prompt_tokens=256)
    sorted_config = SynthConfig(max_new_tokens=5, batch_size=2, sort_batches=4)
    out = tmp_path / "sorted.jsonl"
    run_synth(model, tokenizer, todo, out, sorted_config, STOP, max_batches=1, progress=False)
    assert [r["id"] for r in rows(out)] == ["c1", "c2"]  # shortest first
    run_synth(model, tokenizer, todo, out, sorted_config, STOP, progress=False)
    full = tmp_path / "sorted-full.jsonl"
    run_synth(model, tokenizer, todo, full, sorted_config, STOP, progress=False)
    assert rows(full) == rows(out)
    with pytest.raises(ValueError, match="sort_batches"):
        run_synth(
            model, tokenizer, todo, out, SynthConfig(5, batch_size=2, sort_batches=0), STOP, progress=False
        )

    older = tmp_path / "older.jsonl"  # written before these fields existed: its meta lacks them
    unsorted = SynthConfig(max_new_tokens=5, batch_size=2, sort_batches=0, max_batch_tokens=0)
    run_synth(model, tokenizer, todo, older, unsorted, STOP, max_batches=1, progress=False)
    assert (
        not {"sort_batches", "max_batch_tokens"}
        & json.loads((tmp_path / "older.jsonl.meta.json").read_text()).keys()
    )
    assert run_synth(model, tokenizer, todo, older, unsorted, STOP, progress=False) == 1


def test_bad_synth_settings_are_refused_by_name():
    for field, value in (
        ("batch_size", 0),
        ("sort_batches", -1),
        ("max_new_tokens", 0),
        ("temperature", -1.0),
    ):
        with pytest.raises(ValueError, match=field):
            SynthConfig(**{field: value})


def test_a_token_budget_gives_long_prompts_fewer_rows(pair):
    _, tokenizer = pair
    convs = [
        Conversation(f"c{i}", ({"role": "user", "content": "word " * n},), PROV)
        for i, n in enumerate([1, 1, 1, 60, 60, 1])
    ]
    todo = synth_prompts(convs, tokenizer, max_prompt_tokens=256)
    short, long = len(todo[0].prompt_ids), len(todo[3].prompt_ids)
    config = SynthConfig(max_new_tokens=10, batch_size=3, sort_batches=0, max_batch_tokens=2 * (long + 10))
    assert 3 * (short + 10) <= config.max_batch_tokens < 3 * (long + 10)
    ids = [[p.id for p in b] for b in plan_batches(todo, config)]
    assert ids == [["c0", "c1", "c2"], ["c3", "c4"], ["c5"]]  # the long pair may not take a third row
    alone = SynthConfig(max_new_tokens=10, batch_size=3, sort_batches=0, max_batch_tokens=1)
    assert [len(b) for b in plan_batches(todo, alone)] == [1] * 6  # over budget on its own: runs alone
