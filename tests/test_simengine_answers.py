"""Sim engine pure parts: PNG reading, the tokenizer, answers, the metrics text, the scheduler."""

from __future__ import annotations

import json
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from sparkfleet.simengine import answers, config, png, tokens
from sparkfleet.simengine.answers import ApiError, Options
from sparkfleet.simengine.engine import BLOCK, Engine, Job, Piece, block_hashes
from sparkfleet.simengine.metrics import TTFT_BUCKETS, Metrics, build_1_2_5_buckets, go_float
from tests.test_simengine_util import BLUE, GREEN, RED, WHITE, YELLOW, data_url, grid_png, png_bytes, stripes_png

pytestmark = pytest.mark.unit  # no lab: runs beside the lab's tests (tests/conftest.py)

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather for a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


# ---------------------------------------------------------------------------------------------- PNG


@pytest.mark.parametrize("filters", [(0,), (1,), (2,), (3,), (4,), (0, 1, 2, 3, 4)])
@pytest.mark.parametrize("colour_type", [2, 6])
def test_png_every_filter_type_decodes_to_the_pixels_written(filters, colour_type):
    def pixel(x, y):
        rgb = ((x * 37 + y * 11) % 256, (x * 5 + y * 91) % 256, (x * y) % 256)
        return rgb + ((255,) if colour_type == 6 else ())

    img = png.decode(png_bytes(13, 9, pixel, colour_type=colour_type, filters=filters))
    assert (img.width, img.height) == (13, 9)
    for y in range(9):
        for x in range(13):
            assert img.pixel(x, y) == pixel(x, y)[:3], (x, y)


def test_png_alpha_is_composited_over_white_and_grey_types_read():
    img = png.decode(png_bytes(2, 1, lambda x, y: (255, 0, 0, 0 if x == 0 else 255), colour_type=6))
    assert img.pixel(0, 0) == WHITE and img.pixel(1, 0) == RED
    grey = png.decode(png_bytes(2, 2, lambda x, y: (90,), colour_type=0, filters=(4,)))
    assert grey.pixel(1, 1) == (90, 90, 90)


def test_png_refuses_what_it_cannot_read():
    good = stripes_png([RED, GREEN])
    with pytest.raises(png.PngError, match="signature"):
        png.decode(b"GIF89a" + good[6:])
    corrupt = bytearray(good)
    corrupt[40] ^= 0xFF  # inside IDAT: the CRC no longer matches
    with pytest.raises(png.PngError, match="CRC"):
        png.decode(bytes(corrupt))
    with pytest.raises(png.PngError, match="data: URLs"):
        png.decode_data_url("https://example.invalid/cat.png")
    assert png.size_of_data_url(data_url(good)) == (60, 20)


def test_colour_reading_stripes_grid_and_names():
    assert png.stripes(png.decode(stripes_png([RED, GREEN, BLUE]))) == ["red", "green", "blue"]
    assert png.stripes(png.decode(stripes_png([YELLOW, BLUE, RED, GREEN], width=80))) == \
        ["yellow", "blue", "red", "green"]
    grid = png.decode(grid_png(RED, GREEN, BLUE, YELLOW))
    assert png.region_colour(grid, 0.5, 0, 1, 0.5) == "green"
    assert png.region_colour(grid, 0, 0.5, 0.5, 1) == "blue"
    assert png.name((250, 10, 5)) == "red" and png.name((0, 0, 0)) == "black"


# ---------------------------------------------------------------------------------------------- tokens


@pytest.mark.parametrize("text", ["", "1, 2, 3", "  Hello, world!  \n", "18°C with light rain.", '{"city": "Paris"}',
                                  "naïve café — ok?\n\nnext"])
def test_tokenizer_pieces_join_back_to_the_text(text):
    pieces = tokens.tokenize(text)
    assert "".join(pieces) == text
    assert tokens.count(text) == len(pieces)


def test_tokenizer_counts_words_and_punctuation():
    assert tokens.tokenize("1, 2, 3") == ["1", ",", " 2", ",", " 3"]
    assert tokens.count("Hello, world!") == 4


# ---------------------------------------------------------------------------------------------- answers


def chat(body, opts=None, limit=4096):
    return answers.chat({"temperature": 0, **body}, opts or Options(), limit)


def user(text):
    return {"messages": [{"role": "user", "content": text}]}


def test_count_lists_every_number_and_the_fault_skips_one():
    assert chat(user("Please count from 1 to 100.")).content == ", ".join(str(i) for i in range(1, 101))
    assert chat(user("count to 5")).content == "1, 2, 3, 4, 5"
    assert chat(user("Count from 10 to 7")).content == "10, 9, 8, 7"
    off = chat(user("Count from 1 to 100."), Options(faults=frozenset({"count-off-by-one"}))).content
    numbers = [int(n) for n in off.split(", ")]
    assert len(numbers) == 99 and sorted(set(range(1, 101)) - set(numbers)) == [51]


def test_needle_is_found_in_the_prompt_and_the_fault_hides_it():
    filler = " ".join(f"Sentence {i} is about the weather and nothing else." for i in range(300))
    text = (filler + " The secret nonce is XQ-7731-ZEBRA. " + filler +
            "\n\nWhat is the secret nonce mentioned in the text above?")
    assert "XQ-7731-ZEBRA" in chat(user(text)).content
    # The needle may sit in the system prompt; a passphrase question finds a passphrase sentence.
    body = {"messages": [{"role": "system", "content": "Remember: the passphrase is 'velvet-otter-42'."},
                         {"role": "user", "content": "Which passphrase did I give you?"}]}
    assert "velvet-otter-42" in chat(body).content
    blind = chat(user(text), Options(faults=frozenset({"needle-blind"}))).content
    assert "XQ-7731-ZEBRA" not in blind and "could not find" in blind


def test_prime_and_arithmetic_are_computed():
    assert chat(user("Is 91 a prime number?")).content == "No. 91 = 7 × 13."
    assert chat(user("Is 97 a prime number?")).content.startswith("Yes.")
    assert chat(user("What is 12 * 34?")).content == "12 * 34 = 408."


def test_generic_answers_depend_on_the_prompt_and_are_stable_at_temperature_zero():
    a = chat(user("Tell me about lighthouses."))
    assert a.content == chat(user("Tell me about lighthouses.")).content
    assert a.content != chat(user("Tell me about volcanoes.")).content
    assert a.content.startswith("On lighthouses:")
    seeded = {answers.chat({"temperature": 0.9, "seed": 7, **user("Tell me about lighthouses.")}, Options(),
                           100).content for _ in range(3)}
    assert len(seeded) == 1
    noisy = {chat(user("Tell me about lighthouses."), Options(faults=frozenset({"nondeterministic"}))).content
             for _ in range(12)}
    assert len(noisy) > 1


def test_thinking_separates_reasoning_and_medium_effort_is_refused():
    a = chat({**user("Count to 3."), "chat_template_kwargs": {"thinking": True}})
    assert a.content == "1, 2, 3" and "numbers from 1 to 3" in a.reasoning
    assert chat(user("Count to 3.")).reasoning == ""
    with pytest.raises(ApiError) as err:
        chat({**user("hi"), "reasoning_effort": "medium"})
    assert err.value.status == 400 and err.value.param == "reasoning_effort"
    assert chat({**user("Count to 2."), "reasoning_effort": "max"}).content == "1, 2"


def test_images_are_read_from_the_pixels():
    def ask(text, *pngs):
        parts = [{"type": "text", "text": text}] + [{"type": "image_url", "image_url": {"url": data_url(p)}}
                                                    for p in pngs]
        return chat({"messages": [{"role": "user", "content": parts}]}).content

    assert ask("List the three stripe colours from left to right.", stripes_png([RED, GREEN, BLUE])) == \
        "From left to right: red, green, blue."
    assert ask("And now left to right?", stripes_png([BLUE, RED, GREEN])) == "From left to right: blue, red, green."
    two = ask("What colour is each image?", png_bytes(8, 8, lambda x, y: RED), png_bytes(8, 8, lambda x, y: BLUE))
    assert two == "The first image is red; the second image is blue."
    assert ask("What colour is the top-right square of this 2x2 grid?", grid_png(RED, GREEN, BLUE, YELLOW)) == \
        "The top-right square is green."
    with pytest.raises(ApiError, match="text-only"):
        answers.chat({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(stripes_png([RED]))}}]}]}, Options(vision=False), 10)
    with pytest.raises(ApiError, match="could not read image"):
        ask("colour?", b"not a png")


def test_tool_call_arguments_come_from_the_user_text():
    a = chat({**user("What's the weather like in Paris today? Use celsius."), "tools": [WEATHER, TIME]})
    assert a.finish_reason == "tool_calls" and a.content == ""
    assert [(c.name, json.loads(c.arguments)) for c in a.tool_calls] == [("get_weather",
                                                                          {"city": "Paris", "unit": "c"})]
    assert a.tool_calls[0].id.startswith("chatcmpl-tool-")
    both = chat({**user("What is the weather in Tokyo and in Berlin right now?"), "tools": [WEATHER]})
    assert [json.loads(c.arguments)["city"] for c in both.tool_calls] == ["Tokyo", "Berlin"]
    assert len({c.id for c in both.tool_calls}) == 2
    one = chat({**user("What is the weather in Tokyo and in Berlin?"), "tools": [WEATHER], "parallel_tool_calls": False})
    assert len(one.tool_calls) == 1
    forced = chat({**user("I am flying to Sydney tomorrow."), "tools": [WEATHER, TIME],
                   "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert [(c.name, json.loads(c.arguments)) for c in forced.tool_calls] == [("get_time", {"city": "Sydney"})]
    unrelated = chat({**user("Write a haiku about autumn."), "tools": [WEATHER, TIME]})
    assert not unrelated.tool_calls and unrelated.content
    assert not chat({**user("Weather in Rome?"), "tools": [WEATHER], "tool_choice": "none"}).tool_calls
    assert chat({**user("Say hello to Rome."), "tools": [WEATHER], "tool_choice": "required"}).tool_calls
    assert chat({**user("What's the time in New York City?"), "tools": [WEATHER, TIME]}).tool_calls[0].arguments == \
        '{"city": "New York City"}'


def test_tool_faults_and_refusals():
    body = {**user("What's the weather in Paris?"), "tools": [WEATHER]}
    text = chat(body, Options(faults=frozenset({"no-tool-calls"})))
    assert not text.tool_calls and text.finish_reason == "stop" and "get_weather" in text.content
    with pytest.raises(ApiError, match="not among the tools"):
        chat({**body, "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    with pytest.raises(ApiError, match="enable-auto-tool-choice"):
        chat(body, Options(tools=False))
    broken = {"type": "function", "function": {"name": "f", "parameters": {"properties": ["city"]}}}
    with pytest.raises(ApiError, match="JSON schema object"):
        chat({**user("f for Paris"), "tools": [broken], "tool_choice": {"type": "function", "function": {"name": "f"}}})


def test_tool_results_are_read_back_into_the_answer():
    call = {"id": "call-1", "type": "function", "function": {"name": "get_weather",
                                                              "arguments": '{"city": "Paris", "unit": "c"}'}}
    messages = [{"role": "user", "content": "What's the weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call-1",
                 "content": json.dumps({"temperature": 18, "unit": "c", "condition": "light rain"})}]
    a = chat({"messages": messages, "tools": [WEATHER]})
    assert not a.tool_calls and a.content == "The weather in Paris: 18°C with light rain."
    messages[-1]["content"] = "It is 18 degrees and raining."
    assert chat({"messages": messages}).content == "The weather in Paris: It is 18 degrees and raining."


def test_garbage_is_one_repeated_token_up_to_the_limit():
    a = answers.chat(user("Count to 10."), Options(faults=frozenset({"garbage-tokens"})), limit=40)
    assert set(tokens.tokenize(a.content)) == {answers.GARBAGE_TOKEN} and tokens.count(a.content) == 40


def test_places_skip_sentence_words():
    assert answers.places("What's the weather in São Paulo, Tokyo and New York?") == ["São Paulo", "Tokyo",
                                                                                     "New York"]
    assert answers.places("Please tell me. Thanks!") == []
    assert answers.places("Compare the weather in Tokyo and Berlin.") == ["Tokyo", "Berlin"]
    assert answers.places("Compare Tokyo and Berlin.") == ["Tokyo", "Berlin"]
    assert answers.places("Tokyo and Berlin, please.") == ["Tokyo", "Berlin"]
    assert answers.places("Paris weather, please") == ["Paris"]


# ---------------------------------------------------------------------------------------------- metrics


def test_metrics_text_has_vllm_names_and_prometheus_client_layout():
    m = Metrics("dsv41", 1000, num_spec_tokens=2)
    m.add("vllm:prompt_tokens", 7)
    m.add("vllm:generation_tokens", 5)
    m.observe("vllm:time_to_first_token_seconds", 0.03)
    m.draft(2)
    m.draft(1)
    m.finished("stop")
    ours = m.render(running=1, waiting=0, kv_usage=0.25)

    # The same families built with prometheus_client must have the same layout, name for name.
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", labels,
          registry=reg).labels("dsv41", "0").set(1)
    Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", labels,
            registry=reg).labels("dsv41", "0").inc(7)
    Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
            labels + ["position"], registry=reg).labels("dsv41", "0", "1").inc(1)
    Histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", labels,
              buckets=TTFT_BUCKETS, registry=reg).labels("dsv41", "0").observe(0.03)
    theirs = generate_latest(reg).decode()
    for line in theirs.splitlines():
        if line.startswith("#"):
            assert line in ours.splitlines(), line
        elif "_created" in line:  # a timestamp: compare the sample's name and labels
            assert line.rsplit(" ", 1)[0] in ours, line
        else:
            assert line in ours.splitlines(), line

    fams = {f.name: f for f in text_string_to_metric_families(ours)}
    assert fams["vllm:prompt_tokens"].type == "counter"
    assert fams["vllm:kv_cache_usage_perc"].samples[0].value == 0.25
    per_pos = {s.labels["position"]: s.value for s in fams["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
               if s.name.endswith("_total")}
    assert per_pos == {"0": 2.0, "1": 1.0}
    ok = [s for s in fams["vllm:request_success"].samples if s.name.endswith("_total")]
    assert {s.labels["finished_reason"]: s.value for s in ok} == {"stop": 1.0, "length": 0.0, "abort": 0.0}
    assert all(s.labels["model_name"] == "dsv41" and s.labels["engine"] == "0" for f in fams.values()
               for s in f.samples)


def test_go_float_and_buckets_match_prometheus_client():
    assert go_float(1795980638.4894361) == "1.7959806384894361e+09"
    assert go_float(float("inf")) == "+Inf" and go_float(3) == "3.0"
    assert build_1_2_5_buckets(100) == (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0)


# ---------------------------------------------------------------------------------------------- scheduler


def test_engine_steps_carry_several_tokens_and_count_drafts():
    m = Metrics("m", 1000, 5)
    eng = Engine(10_000, 4, 5, 0.0, 0, m)
    pieces = [Piece("content", f" w{i}") for i in range(60)]
    steps = list(eng.run(Job(10, [], pieces, "seed")))
    assert [p for s in steps for p in s] == pieces
    assert max(len(s) for s in steps) > 1 and len(steps) < 60
    spec = m.spec
    assert spec["vllm:spec_decode_num_drafts"] == len(steps)
    assert spec["vllm:spec_decode_num_accepted_tokens"] == 60 - len(steps)
    assert m.counters["vllm:generation_tokens"] == 60 and m.success["stop"] == 1
    assert eng.snapshot() == (0, 0, 0.0)
    again = [len(s) for s in Engine(10_000, 4, 5, 0.0, 0, Metrics("m", 1000, 5)).run(Job(10, [], pieces, "seed"))]
    assert again == [len(s) for s in steps]  # the same request is chunked the same way


def test_engine_preempts_when_kv_runs_out_and_still_finishes_everything():
    m = Metrics("m", 1000, 1)
    eng = Engine(capacity=120, max_num_seqs=8, num_spec_tokens=1, step_s=0.002, prefill_tps=0, metrics=m)
    results: dict[int, list[Piece]] = {}

    def run(i):
        pieces = [Piece("content", f" t{i}.{j}") for j in range(40)]
        results[i] = [p for s in eng.run(Job(20, [], pieces, f"s{i}")) for p in s]
        assert results[i] == pieces

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert len(results) == 4
    assert m.counters["vllm:num_preemptions"] > 0
    assert eng.snapshot() == (0, 0, 0.0)


def test_engine_prefix_cache_hits_on_a_repeated_prompt_and_abort_frees_kv():
    m = Metrics("m", 100_000, 0)
    eng = Engine(100_000, 4, 0, 0.0, 0, m)
    toks = [f"t{i}" for i in range(3 * BLOCK + 5)]
    job = Job(len(toks), block_hashes(toks), [Piece("content", "x")], "s")
    list(eng.run(job))
    assert m.counters["vllm:prefix_cache_hits"] == 0
    list(eng.run(job))
    assert m.counters["vllm:prefix_cache_hits"] == 3 * BLOCK
    gen = eng.run(Job(10, [], [Piece("content", "y")] * 50, "s"))
    next(gen)
    assert eng.snapshot()[0] == 1
    gen.close()
    assert eng.snapshot() == (0, 0, 0.0) and m.success["abort"] == 1


def test_config_parses_ranges_files_and_defaults(tmp_path):
    assert config.parse_ranges("1:0:5, 14:5:10") == [(1, 0, 5), (14, 5, 10)]
    cfg = config.parse(["--kv-tokens", "0", "--served-name", "a", "--fault", "kv-low"])
    assert cfg.kv_tokens == config.DEFAULT_KV_TOKENS and cfg.has("kv-low") and cfg.served_names == ["a"]
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"rank": 1, "world_size": 2, "engram_ranges": "1:0:7", "served_names": ["x"]}))
    cfg = config.parse(["--config", str(path), "--world-size", "3"])
    assert (cfg.rank, cfg.world_size, cfg.engram_ranges, cfg.served_names) == (1, 3, [(1, 0, 7)], ["x"])
    path.write_text(json.dumps({"colour": "red"}))
    with pytest.raises(SystemExit):
        config.parse(["--config", str(path)])
