"""The tokens an answer reports, read from its ends in every dialect's words (pure): what
usage per key, the key token counters and the tokens-per-day limits count."""

from __future__ import annotations

from rosterd.router.history import generated_tokens
from rosterd.router.usage_hook import prompt_tokens


def test_chat_completions_usage_comes_before_llama_servers_timings() -> None:
    tail = b'{"usage":{"prompt_tokens":34,"completion_tokens":8},"timings":{"prompt_n":1}}'
    assert (prompt_tokens(tail), generated_tokens(tail)) == (34, 8)


def test_anthropic_counts_the_whole_prompt_with_what_its_cache_held() -> None:
    plain = b'"usage":{"cache_read_input_tokens":33,"input_tokens":1,"output_tokens":8}}'
    assert (prompt_tokens(plain), generated_tokens(plain)) == (34, 8)
    # A stream says its prompt in message_start, at the start; its end has the output only.
    head = b'event: message_start\ndata: {"usage":{"input_tokens":34,"output_tokens":0}}'
    tail = b'data: {"type":"message_delta","usage":{"output_tokens":8}}\n\n'
    assert (prompt_tokens(tail, head), generated_tokens(tail)) == (34, 8)


def test_responses_input_tokens_already_hold_the_cached_ones() -> None:
    tail = (
        b'"usage":{"input_tokens":34,"output_tokens":8,"input_tokens_details":'
        b'{"cached_tokens":33}}},"timings":{"prompt_n":1,"predicted_n":8}}'
    )
    assert (prompt_tokens(tail), generated_tokens(tail)) == (34, 8)


def test_ollamas_own_counts_and_none_said() -> None:
    tail = b'{"done":true,"prompt_eval_count":12,"eval_count":4}\n'
    assert (prompt_tokens(tail), generated_tokens(tail)) == (12, 4)
    assert (prompt_tokens(b'{"data":[]}'), generated_tokens(b'{"data":[]}')) == (0, 0)
