"""The AI gateway's pure parts: the providers file, the usage of answers, recovery times, the
model a call names."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from activities.gateway_http import call_of, same_token, too_many_values
from activities.gateway_providers import Budgets, GatewaySettings, load_providers
from activities.gateway_usage import StreamUsage, Usage, recovers_at, usage_of
from receipts.settings import SettingsError

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def test_a_providers_file_gives_pools_with_keys_from_env_or_files(tmp_path: Path) -> None:
    key_file = tmp_path / "anthropic.key"
    key_file.write_text("sk-ant-from-file\n")
    path = tmp_path / "providers.yaml"
    path.write_text(
        f"""
providers:
  - id: openai-main
    api: openai
    baseUrl: https://api.openai.com/v1/
    credentials:
      - {{id: a, env: OPENAI_KEY_A, maxConcurrent: 2}}
      - {{id: b, env: OPENAI_KEY_MISSING}}
  - id: anthropic-main
    api: anthropic
    baseUrl: https://api.anthropic.com
    credentials:
      - {{id: f, file: {key_file}}}
  - id: spare
    api: openai
    baseUrl: https://example.invalid/v1
    disabled: true
    streamUsage: false
"""
    )
    providers = load_providers(path, {"OPENAI_KEY_A": "sk-a"})
    main = providers["openai-main"]
    assert main.base_url == "https://api.openai.com/v1"
    assert [(c.id, c.key, c.max_concurrent) for c in main.credentials] == [("a", "sk-a", 2)]
    assert main.unusable == ("b",) and main.dead is None
    assert repr(main.credentials[0].key) == "Secret('***')"
    assert providers["anthropic-main"].credentials[0].key == "sk-ant-from-file"
    assert providers["spare"].dead == "provider 'spare' is disabled"
    assert main.stream_usage and not providers["spare"].stream_usage


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("providers: [{id: x, api: grpc, baseUrl: 'http://h'}]", "providers.0.api"),
        ("providers: [{id: x, api: openai, baseUrl: 'ftp://h'}]", "providers.0.baseUrl"),
        ("providers: [{id: x, api: openai, baseUrl: 'http://h', credentials: [{id: k}]}]",
         "exactly one of env or file"),
        ("providers: [{id: x, api: openai, baseUrl: 'http://h', key: sk-inline}]", "providers.0.key"),
    ],
)  # fmt: skip
def test_a_bad_providers_file_is_refused_naming_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "providers.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=message):
        load_providers(path, {})


def test_usage_is_read_from_each_api_style() -> None:
    chat = usage_of({"usage": {"prompt_tokens": 3, "completion_tokens": 4}})
    responses = usage_of(
        {
            "type": "response.completed",
            "response": {"usage": {"input_tokens": 5, "output_tokens": 6}},
        }
    )
    messages = usage_of({"usage": {"input_tokens": 7, "output_tokens": 8}})
    assert [(u.input_tokens, u.output_tokens) for u in (chat, responses, messages)] == [
        (3, 4), (5, 6), (7, 8),
    ]  # fmt: skip
    stream = StreamUsage()
    for chunk in (
        b'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tok',
        b'ens":9,"output_tokens":1}}}\n\ndata: {"type":"message_delta","usage":{"output_tokens":5}}',
        b'\n\ndata: {"type":"message_delta","usage":{"output_tokens":12}}\n\ndata: [DONE]\n\n',
    ):
        stream.feed(chunk)
    assert (stream.usage.input_tokens, stream.usage.output_tokens) == (9, 12)


@pytest.mark.parametrize(
    ("headers", "after"),
    [
        ({"retry-after": "30"}, timedelta(seconds=30)),
        ({"retry-after": "Wed, 02 Dec 2026 12:05:00 GMT"}, timedelta(minutes=5)),
        ({"x-ratelimit-reset-requests": "1m30s", "x-ratelimit-reset-tokens": "6ms"}, timedelta(seconds=90)),
        ({"anthropic-ratelimit-tokens-reset": "2026-12-02T12:00:45Z"}, timedelta(seconds=45)),
        ({}, None),
        ({"retry-after": "soon"}, None),
    ],
)  # fmt: skip
def test_the_recovery_time_of_a_quota_refusal(
    headers: dict[str, str], after: timedelta | None
) -> None:
    assert recovers_at(headers, NOW) == (NOW + after if after is not None else None)


def model_of(body: bytes) -> str | None:
    """The model a call names, as the gateway reads it (`call_of`), or None."""
    call = call_of(body)
    return call.model if call is not None else None


def test_a_call_s_model_is_the_top_level_one_of_its_body() -> None:
    long = "x" * 100_000  # past the 64 KiB a large body was once searched in
    assert model_of(json.dumps({"messages": [long], "model": "a"}).encode()) == "a"
    assert model_of(b'{"metadata": {"model": "b"}, "model": "a"}') == "a"
    assert model_of(b'{"model": "b", "model": "a"}') == "a"  # the last, as a JSON parser reads it
    for body in (b'{"metadata": {"model": "b"}}', b'{"model": 5}', b'{"model": ""}', b"[]", b"{"):
        assert model_of(body) is None
    assert too_many_values(b"[" + b"{}," * 1_000_000 + b"{}]")
    assert not too_many_values(json.dumps({"model": "a", "input": [long] * 300}).encode())


def test_anthropic_s_prompt_cache_tokens_are_input_tokens() -> None:
    """Messages counts cache writes and reads apart from `input_tokens` (they were dropped: a
    turn of mostly cached context reported a few input tokens)."""
    cached = {"input_tokens": 3, "cache_creation_input_tokens": 100, "cache_read_input_tokens": 40}
    assert usage_of({"usage": {**cached, "output_tokens": 8}}).input_tokens == 143
    stream = StreamUsage()
    start = {"type": "message_start", "message": {"usage": {**cached, "output_tokens": 1}}}
    delta = {"type": "message_delta", "usage": {"output_tokens": 9}}
    stream.feed(f"data: {json.dumps(start)}\n\ndata: {json.dumps(delta)}\n\n".encode())
    assert (stream.usage.input_tokens, stream.usage.output_tokens) == (143, 9)
    # OpenAI's cached tokens are part of prompt_tokens already: not counted twice.
    chat = {
        "prompt_tokens": 50,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 40},
    }
    assert usage_of({"usage": chat}).input_tokens == 50


def test_network_tools_are_taken_out_and_the_rest_kept() -> None:
    from activities.gateway_http import call_of, without_network_tools

    body = {
        "model": "m",
        "input": [{"role": "user", "content": "é"}],
        "tools": [{"type": "function", "name": "f"}, {"type": "web_search"}, {"type": "mcp"}],
        "mcp_servers": [{"url": "https://x.example"}],
    }
    named = call_of(json.dumps(body).encode())
    assert named is not None and named.network_tools == ["mcp_servers", "web_search", "mcp"]
    kept = json.loads(without_network_tools(json.dumps(body).encode()))
    assert kept == {
        "model": "m",
        "input": [{"role": "user", "content": "é"}],
        "tools": [{"type": "function", "name": "f"}],
    }
    only = json.loads(without_network_tools(b'{"model": "m", "tools": [{"type": "web_fetch_1"}]}'))
    assert only == {"model": "m"}  # an empty tools list goes too


def test_a_json_answer_past_what_is_kept_has_its_usage_read_from_its_end() -> None:
    """An answer longer than the 4 MiB kept of it (n=128 choices: 5 MB) was read as 0 tokens;
    its usage, written after the content, is read from its last bytes."""
    from activities.gateway_http import MAX_JSON_ANSWER_BYTES, json_usage

    usage = {"prompt_tokens": 1200, "completion_tokens": 640, "total_tokens": 1840}
    answer = json.dumps(
        {"choices": [{"message": {"content": "x" * MAX_JSON_ANSWER_BYTES}}], "usage": usage}
    ).encode()
    head, tail = answer[:MAX_JSON_ANSWER_BYTES], answer[-64 * 1024 :]
    assert json_usage(head, tail) == Usage(1200, 640)
    assert json_usage(head, b'..."content": "a \\"usage\\" word"}') == Usage()  # none there
    assert json_usage(json.dumps({"usage": usage}).encode()) == Usage(1200, 640)  # whole


def test_chat_search_options_and_a_duplicated_tools_key_are_taken_out_too() -> None:
    """Chat Completions searches the web on the provider's side with `web_search_options` (not
    a tool); a body naming `tools` twice read as the last by the gateway might be read as the
    first by a provider: both are written again without them."""
    from activities.gateway_http import call_of, may_hide_tools, without_network_tools

    search = b'{"model": "m", "messages": [], "web_search_options": {}}'
    named = call_of(search)
    assert named is not None and named.network_tools == ["web_search_options"]
    assert json.loads(without_network_tools(search)) == {"model": "m", "messages": []}
    twice = b'{"model": "m", "tools": [{"type": "mcp", "server_url": "x"}], "tools": []}'
    named = call_of(twice)
    assert named is not None and named.network_tools == [] and may_hide_tools(twice)
    assert json.loads(without_network_tools(twice)) == {"model": "m"}
    assert not may_hide_tools(b'{"model": "m", "tools": [{"type": "function"}]}')


def test_a_count_that_is_no_whole_number_of_tokens_is_read_as_none() -> None:
    """A provider's usage adds to the turn's: a negative, fractional or boolean count is read
    as zero, so no answer takes tokens off what the turn used."""
    negative = usage_of({"usage": {"prompt_tokens": -50, "completion_tokens": -7}})
    odd = usage_of({"usage": {"input_tokens": 1.5, "output_tokens": True}})
    assert [(u.input_tokens, u.output_tokens) for u in (negative, odd)] == [(0, 0), (0, 0)]


def test_a_turn_at_quota_is_delayed_until_the_later_of_the_gateway_s_and_its_own_reset() -> None:
    """The gateway saw quota until `seen`; a command that names a later `retryAt` (a quota the
    gateway's calls did not meet yet) is delayed until that one, a sooner one until `seen`."""
    from activities.gateway_grant import Grant
    from activities.handlers.agent_turn import _as_the_gateway_saw

    grant = Grant("t", "job", 1, "coder", "org-a", "openai-main")
    seen = NOW + timedelta(seconds=30)
    grant.met_quota("m", seen)
    later, sooner = seen + timedelta(hours=1), seen - timedelta(seconds=20)
    delays = [
        _as_the_gateway_saw({"outcome": "quota_exhausted", "retryAt": at.isoformat()}, grant)
        for at in (later, sooner)
    ]
    assert [d["outcome"] for d in delays] == ["quota_exhausted"] * 2
    assert [d["retryAt"] for d in delays] == [later.isoformat(), seen.isoformat()]


def test_a_sooner_reset_met_later_does_not_shorten_a_turn_s_quota() -> None:
    from activities.gateway_grant import Grant

    grant = Grant("t", "job", 1, "coder", "org-a", "openai-main")
    grant.met_quota("m", NOW + timedelta(minutes=5))
    grant.met_quota("m", NOW + timedelta(seconds=10))
    assert grant.quota_until == NOW + timedelta(minutes=5)


def test_daily_token_budgets_read_a_default_and_organizations_own() -> None:
    """`RECEIPT_GATEWAY_ORG_DAILY_BUDGET`: a number for every organization, `org=number` for
    one (0: no budget); an admin's jobs (no organization) have none."""
    budgets = GatewaySettings.load(
        {"RECEIPT_GATEWAY_ORG_DAILY_BUDGET": " 200000, acme=1000000 ,lab=0"}
    ).budgets
    assert (budgets.of("other"), budgets.of("acme"), budgets.of("lab")) == (200_000, 10**6, 0)
    assert budgets.of(None) == 0 and budgets.any
    assert not GatewaySettings.load({}).budgets.any
    assert Budgets(0, {"lab": 0}).any is False and Budgets(0, {"acme": 5}).of("acme") == 5


@pytest.mark.parametrize(
    "raw",
    # Not whole numbers of ASCII digits (`str.isdigit` takes `٣` and `²`), or a budget given
    # twice (one of them silently dropped: the first default, or acme's million).
    ["many", "200000,=5", "acme=1e6", "-3", "٣", "acme=²", "100,200", "acme=1000000,acme=0"],
)
def test_a_bad_daily_token_budget_names_the_variable_and_the_item(raw: str) -> None:
    with pytest.raises(SettingsError) as raised:
        GatewaySettings.load({"RECEIPT_GATEWAY_ORG_DAILY_BUDGET": raw})
    message = str(raised.value)
    assert message.startswith("RECEIPT_GATEWAY_ORG_DAILY_BUDGET must be a whole number")
    assert message.endswith(f"got {raw!r}")


def test_a_spent_budget_holds_the_turn_until_midnight_whatever_quota_a_model_met() -> None:
    """A model's quota recovers in 30 s, but the organization's daily budget is spent until
    midnight: the turn waits until midnight (README: it settles `quota_exhausted` until then),
    not 30 s to be refused again by the budget, turn after turn."""
    from activities.gateway_grant import BUDGET_QUOTA, Grant
    from activities.handlers.agent_turn import _as_the_gateway_saw

    grant = Grant("t", "job", 1, "coder", "org-a", "openai-main")
    midnight = datetime(2026, 12, 3, tzinfo=UTC)
    grant.met_quota("m", NOW + timedelta(seconds=30))
    grant.met_quota(BUDGET_QUOTA, midnight)
    assert grant.quota_until == midnight
    outcome = _as_the_gateway_saw({"outcome": "failed", "error": "429"}, grant)
    assert outcome == {"outcome": "quota_exhausted", "retryAt": midnight.isoformat()}


def test_a_call_s_token_is_compared_whole_and_in_constant_time() -> None:
    """The turn's token against the call's: equal only when whole, and a header of any
    characters (HTTP headers arrive as latin-1 text) is a refusal, not an error."""
    token = "rt_3f9a1c"
    assert same_token(token, token)
    assert not same_token(token[:-1], token)
    assert not same_token(token + "0", token)
    assert not same_token("", token)
    assert not same_token("rt_3f9a1\xe9", token)  # hmac.compare_digest refuses such str
