"""Real clients against the gateway: the official OpenAI and Anthropic Python SDKs.

tests/tests/sdk_clients.rs starts a mock engine for each of two sites, a gateway in front of
them (with a tag key, so stored ids carry a mac), then runs this file with:

    GRID_ROUTE_GATEWAY_URL   http://IP:PORT of the gateway
    GRID_ROUTE_ENGINES       site=engine pairs, comma-separated: which mock engine serves
                             each site (an engine starts each reply with `[its name]`)
    GRID_ROUTE_MODEL         the model the engines serve
    GRID_ROUTE_ADMIN_URL     http://IP:PORT of the gateway's admin port (its /metrics)
    GRID_ROUTE_ENGINE_URLS   engine=URL pairs, comma-separated, for the mock engines' own
                             controls (`POST /mock/queue`)
    GRID_ROUTE_SESSION_HEADER the header the gateway is configured to read a session id from

Each scenario is one function named as the behaviour it checks. The clients validate every
answer, streamed events included, against the SDKs' own types (`_strict_response_validation`)
and never retry, so an answer the SDK could not parse, or a failure hidden by a retry, fails
here. `main()` runs every scenario and exits 1 naming those that failed.
"""

import os
import re
import sys
import time
import traceback
import urllib.request
import uuid
from pathlib import Path

SETUP = "tests/sdk/setup && cargo test -p grid-route-tests --features sdk --test sdk_clients"
try:
    import anthropic
    import openai
except ImportError as error:
    sys.exit(f"{error}: {sys.executable} does not have the SDKs; run `{SETUP}`")

GATEWAY_URL = os.environ["GRID_ROUTE_GATEWAY_URL"]
MODEL = os.environ.get("GRID_ROUTE_MODEL", "demo-model")
ENGINES = dict(pair.split("=", 1) for pair in os.environ["GRID_ROUTE_ENGINES"].split(","))
ADMIN_URL = os.environ["GRID_ROUTE_ADMIN_URL"]
ENGINE_URLS = dict(
    pair.split("=", 1) for pair in os.environ["GRID_ROUTE_ENGINE_URLS"].split(",")
)
SESSION_HEADER = os.environ["GRID_ROUTE_SESSION_HEADER"]
# Every wait here ends: a condition not met by then fails its scenario.
WAIT_SECONDS = 10

# `resp_<site>.<cluster digest>.<mac>.<engine id>` (docs/architecture.md, "Pinning"); the gateway has a
# tag key, so the mac is 16 hex digits.
TAGGED_ID = re.compile(
    r"^(?P<kind>resp|conv)_(?P<site>[a-z0-9-]+)\.(?P<cluster>[0-9a-f]{8})\.[0-9a-f]{16}"
    r"\.(?P<id>.+)$"
)


def openai_client():
    return openai.OpenAI(
        base_url=f"{GATEWAY_URL}/v1",
        api_key="not-checked",
        max_retries=0,
        timeout=30,
        _strict_response_validation=True,
    )


def anthropic_client():
    return anthropic.Anthropic(
        base_url=GATEWAY_URL,
        api_key="not-checked",
        max_retries=0,
        timeout=30,
        _strict_response_validation=True,
    )


def tag(stored_id, kind):
    """The (site, cluster digest) a tagged id of `kind` (`resp` or `conv`) names."""
    match = TAGGED_ID.match(stored_id)
    assert match, f"not a tagged id: {stored_id!r}"
    assert match["kind"] == kind, f"{stored_id!r} is not a {kind}_ id"
    assert match["site"] in ENGINES, f"{stored_id!r} names an unknown site"
    return match["site"], match["cluster"]


def assert_reply(text, engine, question):
    """The mock engine's reply: its name in brackets, then the question's first six words."""
    expected = " ".join([f"[{engine}]", *question.split()[:6]])
    assert text == expected, f"reply {text!r}, expected {expected!r}"


def replying_engine(text):
    """The engine that wrote a reply."""
    match = re.match(r"^\[([a-z0-9-]+)\]", text)
    assert match, f"not a mock engine's reply: {text!r}"
    assert match[1] in ENGINES.values(), f"reply from an unknown engine: {text!r}"
    return match[1]


# ---- OpenAI: Chat Completions --------------------------------------------------------------


def chat_completion_answers():
    question = "hello from the openai sdk"
    completion = openai_client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": question}]
    )
    assert completion.object == "chat.completion"
    assert completion.model == MODEL
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.role == "assistant"
    assert_reply(choice.message.content, replying_engine(choice.message.content), question)
    assert completion.usage.prompt_tokens > 0
    assert completion.usage.completion_tokens == len(choice.message.content.split())


def streamed_chat_completion_arrives_token_by_token():
    question = "stream a chat completion to me"
    stream = openai_client().chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": question}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(chunk.object == "chat.completion.chunk" for chunk in chunks)
    assert len({chunk.id for chunk in chunks}) == 1, "one id for the whole stream"
    choices = [chunk.choices[0] for chunk in chunks if chunk.choices]
    pieces = [choice.delta.content for choice in choices if choice.delta.content]
    text = "".join(pieces)
    assert_reply(text, replying_engine(text), question)
    assert len(pieces) == len(text.split()), "one chunk a token"
    finishes = [choice.finish_reason for choice in choices if choice.finish_reason]
    assert finishes == ["stop"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(pieces)


# ---- OpenAI: Responses ---------------------------------------------------------------------


def a_response_chain_stays_on_the_cluster_its_tagged_ids_name():
    client = openai_client()
    first = client.responses.create(model=MODEL, input="first turn of a chain")
    assert first.status == "completed"
    site, cluster = tag(first.id, "resp")
    assert_reply(first.output_text, ENGINES[site], "first turn of a chain")

    previous = first
    for question in ["second turn", "third turn", "fourth and last turn"]:
        follow_up = client.responses.create(
            model=MODEL, input=question, previous_response_id=previous.id
        )
        assert follow_up.status == "completed"
        assert tag(follow_up.id, "resp") == (site, cluster), "a follow-up stays pinned"
        assert follow_up.previous_response_id == previous.id, "its previous id comes back tagged"
        assert_reply(follow_up.output_text, ENGINES[site], question)
        assert follow_up.usage.input_tokens > previous.usage.input_tokens, "the context grew"
        previous = follow_up

    assert client.responses.retrieve(first.id).output_text == first.output_text
    inputs = client.responses.input_items.list(previous.id)
    assert [item.content[0].text for item in inputs] == ["fourth and last turn"]


def a_streamed_response_completes_with_a_tagged_id():
    client = openai_client()
    question = "stream this response to me please"
    events = list(client.responses.create(model=MODEL, input=question, stream=True))
    kinds = [event.type for event in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed", kinds
    assert "response.output_text.delta" in kinds
    assert [event.sequence_number for event in events] == list(range(len(events)))
    completed = events[-1].response
    assert completed.status == "completed"
    site, cluster = tag(completed.id, "resp")
    assert events[0].response.id == completed.id, "every event names the tagged id"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == completed.output_text
    assert_reply(completed.output_text, ENGINES[site], question)

    follow_up = client.responses.create(
        model=MODEL, input="a follow-up", previous_response_id=completed.id
    )
    assert tag(follow_up.id, "resp") == (site, cluster)


def the_responses_stream_helper_assembles_the_final_response():
    question = "assemble the response from events"
    with openai_client().responses.stream(model=MODEL, input=question) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    site, _ = tag(final.id, "resp")
    assert "".join(deltas) == final.output_text
    assert_reply(final.output_text, ENGINES[site], question)


def a_conversation_collects_its_turns_on_its_cluster():
    client = openai_client()
    conversation = client.conversations.create(metadata={"topic": "sdk tests"})
    site, cluster = tag(conversation.id, "conv")

    questions = ["first question here", "second question here"]
    for question in questions:
        response = client.responses.create(
            model=MODEL, input=question, conversation=conversation.id
        )
        assert response.conversation.id == conversation.id, "the conversation comes back tagged"
        assert tag(response.id, "resp") == (site, cluster), "it ran where the conversation is"
        assert_reply(response.output_text, ENGINES[site], question)

    items = list(client.conversations.items.list(conversation.id, order="asc"))
    turns = [(item.role, item.content[0].text) for item in items]
    assert [role for role, _ in turns] == ["user", "assistant", "user", "assistant"], turns
    assert [text for role, text in turns if role == "user"] == questions
    assert client.conversations.retrieve(conversation.id).metadata == {"topic": "sdk tests"}


def an_unknown_stored_id_is_a_not_found_error():
    client = openai_client()
    for stored_id in ["resp_never-stored", "resp_east.00000000.0000000000000000.forged"]:
        try:
            client.responses.retrieve(stored_id)
        except openai.NotFoundError as error:
            assert error.status_code == 404
            assert error.body["message"], "an OpenAI-style error body"
        else:
            raise AssertionError(f"{stored_id} was found")


# ---- Anthropic: Messages -------------------------------------------------------------------


def an_anthropic_message_answers():
    question = "hello from the anthropic sdk"
    message = anthropic_client().messages.create(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": question}]
    )
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason == "end_turn"
    text = message.content[0].text
    assert_reply(text, replying_engine(text), question)
    assert message.usage.output_tokens == len(text.split())


def an_anthropic_message_streams_with_the_stream_helper():
    question = "stream an anthropic message to me"
    with anthropic_client().messages.stream(
        model=MODEL, max_tokens=64, messages=[{"role": "user", "content": question}]
    ) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    text = final.content[0].text
    assert "".join(pieces) == text
    assert len(pieces) == len(text.split()), "one delta a token"
    assert final.stop_reason == "end_turn"
    assert_reply(text, replying_engine(text), question)


def an_anthropic_message_streams_its_raw_events():
    question = "raw anthropic events please"
    events = list(
        anthropic_client().messages.create(
            model=MODEL,
            max_tokens=64,
            messages=[{"role": "user", "content": question}],
            stream=True,
        )
    )
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop", kinds
    assert kinds[-3:-1] == ["content_block_stop", "message_delta"], kinds
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert_reply(text, replying_engine(text), question)
    assert events[-2].delta.stop_reason == "end_turn"


# ---- Sessions: what clients already send keeps a conversation on its cluster ---------------
#
# Each conversation below has no system prompt and every turn adds more than a fifth of its
# prompt while staying under 8 KiB, so no turn can stick by its prefix match. Its client
# rewrites its history at each turn (`stamped`), so no turn continues the one before it to
# the byte: only the session keeps it where it was answered (the last scenario sends its
# history back as it was, and needs no session). The gateway counts each such decision as
# `grid_route_prefix_affinity_total{outcome="session"}`, which these scenarios read on the
# admin port (they run one at a time, so a change in a count is theirs).

# Bytes of each turn's question: 700 (under the four keys a match needs), then 3 and 4 KiB.
TURN_BYTES = [700, 3072, 4096]


SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scraped(name, **labels):
    """The value of the series `name` with these labels on the admin port (0 when absent)."""
    with urllib.request.urlopen(f"{ADMIN_URL}/metrics", timeout=WAIT_SECONDS) as page:
        for line in page.read().decode().splitlines():
            sample = SAMPLE.match(line)
            if sample and sample["name"] == name:
                if dict(LABEL.findall(sample["labels"] or "")) == labels:
                    return float(sample["value"])
    return 0.0


def outcomes():
    return {
        outcome: scraped("grid_route_prefix_affinity_total", outcome=outcome)
        for outcome in ["session", "load_override", "no_match", "sticky"]
    }


def question(topic, turn):
    words = []
    while len(" ".join(words)) < TURN_BYTES[turn]:
        words.append(f"{topic}-{turn}-{len(words)}")
    return " ".join(words)[: TURN_BYTES[turn]]


def stamped(messages, turn):
    """`messages` as a client that rewrites its history at each turn sends them: the turn
    stamped on the first message. No turn then continues the one before it to the byte,
    so the gateway cannot follow the conversation by its prompts, only by a session."""
    first = dict(messages[0], content=f"[turn {turn}] {messages[0]['content']}")
    return [first] + messages[1:]


def chat_turns(topic, turns, rewrite_history=False, **extra):
    """Asks `turns` turns of one conversation with Chat Completions; the engine of each.
    With `rewrite_history`, the client sends its history `stamped`."""
    client = openai_client()
    messages, engines = [], []
    for turn in range(turns):
        messages.append({"role": "user", "content": question(topic, turn)})
        sent = stamped(messages, turn) if rewrite_history else messages
        completion = client.chat.completions.create(model=MODEL, messages=sent, **extra)
        reply = completion.choices[0].message.content
        engines.append(replying_engine(reply))
        messages.append({"role": "assistant", "content": reply})
    return engines


def a_conversation_with_prompt_cache_key_stays_on_its_cluster():
    before = outcomes()
    key = f"conv-{uuid.uuid4()}"
    engines = chat_turns(key, 3, rewrite_history=True, prompt_cache_key=key)
    assert len(set(engines)) == 1, f"the turns moved: {engines}"
    after = outcomes()
    assert after["session"] - before["session"] == 2, (before, after)


def an_anthropic_conversation_with_metadata_user_id_stays_on_its_cluster():
    client = anthropic_client()
    # Claude Code's shape: the session is the last part of `user_id`.
    user_id = f"user_0_account_0_session_{uuid.uuid4()}"
    before = outcomes()
    messages, engines = [], []
    for turn in range(3):
        messages.append({"role": "user", "content": question(user_id, turn)})
        message = client.messages.create(
            model=MODEL,
            max_tokens=64,
            messages=stamped(messages, turn),
            metadata={"user_id": user_id},
        )
        reply = message.content[0].text
        engines.append(replying_engine(reply))
        messages.append({"role": "assistant", "content": reply})
    assert len(set(engines)) == 1, f"the turns moved: {engines}"
    after = outcomes()
    assert after["session"] - before["session"] == 2, (before, after)


def a_conversation_with_the_configured_session_header_stays_on_its_cluster():
    session = f"header-{uuid.uuid4()}"
    before = outcomes()
    engines = chat_turns(session, 3, rewrite_history=True, extra_headers={SESSION_HEADER: session})
    assert len(set(engines)) == 1, f"the turns moved: {engines}"
    middle = outcomes()
    assert middle["session"] - before["session"] == 2, (before, middle)
    # `x-session-id`, the default, is not read when the config names another header.
    if SESSION_HEADER != "x-session-id":
        other = f"unread-{uuid.uuid4()}"
        chat_turns(other, 2, rewrite_history=True, extra_headers={"x-session-id": other})
        assert outcomes()["session"] == middle["session"], "an unconfigured header was read"


def two_tenants_with_one_prompt_cache_key_do_not_share_a_session():
    key = f"shared-{uuid.uuid4()}"
    client = openai_client()
    first = [{"role": "user", "content": question(key, 0)}]
    completion = client.chat.completions.create(
        model=MODEL, messages=first, prompt_cache_key=key, extra_body={"cache_salt": "tenant-a"}
    )
    reply = completion.choices[0].message.content
    second = first + [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": question(key, 1)},
    ]
    # Tenant b names the same key under its own salt: tenant a's session is not its own.
    before = outcomes()
    client.chat.completions.create(
        model=MODEL, messages=second, prompt_cache_key=key, extra_body={"cache_salt": "tenant-b"}
    )
    middle = outcomes()
    assert middle["session"] == before["session"], "tenant b used tenant a's session"
    # Tenant a's own next turn is a session decision.
    client.chat.completions.create(
        model=MODEL, messages=second, prompt_cache_key=key, extra_body={"cache_salt": "tenant-a"}
    )
    assert outcomes()["session"] - middle["session"] == 1


def a_conversation_sent_back_as_it_came_stays_on_its_cluster_without_a_session():
    before = outcomes()
    engines = chat_turns(f"verbatim-{uuid.uuid4()}", 3)
    assert len(set(engines)) == 1, f"the turns moved: {engines}"
    after = outcomes()
    # Each later turn names the prompt before it: the gateway's own session.
    assert after["session"] - before["session"] == 2, (before, after)
    # Rewritten at each turn, a conversation is one the gateway cannot follow.
    before = after
    chat_turns(f"rewritten-{uuid.uuid4()}", 3, rewrite_history=True)
    assert outcomes()["session"] == before["session"], "a rewritten history was followed"


def set_waiting(engine, waiting):
    """Makes `engine` report `waiting` queued requests (0: its own count again)."""
    body = f'{{"waiting": {waiting}, "exact": {"true" if waiting else "false"}}}'.encode()
    request = urllib.request.Request(
        f"{ENGINE_URLS[engine]}/mock/queue",
        data=body,
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=WAIT_SECONDS) as answer:
        assert answer.status == 200


def wait_for_queue(engine, check):
    """Waits until the gateway's queue depth of `engine`'s cluster passes `check`."""
    site = next(site for site, name in ENGINES.items() if name == engine)
    deadline = time.monotonic() + WAIT_SECONDS
    while not check(depth := scraped("grid_route_queue_depth", site=site, cluster=engine)):
        assert time.monotonic() < deadline, f"{engine}'s queue depth stayed at {depth}"
        time.sleep(0.05)


def a_session_whose_cluster_is_overloaded_goes_elsewhere():
    key = f"busy-{uuid.uuid4()}"
    client = openai_client()
    first = [{"role": "user", "content": question(key, 0)}]
    completion = client.chat.completions.create(model=MODEL, messages=first, prompt_cache_key=key)
    reply = completion.choices[0].message.content
    home = replying_engine(reply)
    second = first + [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": question(key, 1)},
    ]
    # Three queued requests at home cost more than its 700 bytes of prompt save.
    set_waiting(home, 3)
    try:
        wait_for_queue(home, lambda depth: depth >= 3)
        before = outcomes()
        completion = client.chat.completions.create(
            model=MODEL, messages=second, prompt_cache_key=key
        )
        moved = replying_engine(completion.choices[0].message.content)
        assert moved != home, f"an overloaded {home} kept the session"
        after = outcomes()
        assert after["load_override"] - before["load_override"] == 1, (before, after)
        assert after["session"] == before["session"], (before, after)
    finally:
        set_waiting(home, 0)
        wait_for_queue(home, lambda depth: depth == 0)


SCENARIOS = [
    chat_completion_answers,
    streamed_chat_completion_arrives_token_by_token,
    a_response_chain_stays_on_the_cluster_its_tagged_ids_name,
    a_streamed_response_completes_with_a_tagged_id,
    the_responses_stream_helper_assembles_the_final_response,
    a_conversation_collects_its_turns_on_its_cluster,
    an_unknown_stored_id_is_a_not_found_error,
    an_anthropic_message_answers,
    an_anthropic_message_streams_with_the_stream_helper,
    an_anthropic_message_streams_its_raw_events,
    a_conversation_with_prompt_cache_key_stays_on_its_cluster,
    an_anthropic_conversation_with_metadata_user_id_stays_on_its_cluster,
    a_conversation_with_the_configured_session_header_stays_on_its_cluster,
    two_tenants_with_one_prompt_cache_key_do_not_share_a_session,
    a_session_whose_cluster_is_overloaded_goes_elsewhere,
    a_conversation_sent_back_as_it_came_stays_on_its_cluster_without_a_session,
]


def installed_sdks_are_the_pinned_ones():
    pins = dict(
        line.split("==", 1)
        for line in (Path(__file__).parent / "requirements.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    installed = {"openai": openai.__version__, "anthropic": anthropic.__version__}
    for name, version in installed.items():
        pinned = pins[name]
        assert version == pinned, f"{name} {version} installed, {pinned} pinned: run `{SETUP}`"


def main():
    print(f"openai {openai.__version__}, anthropic {anthropic.__version__}, gateway {GATEWAY_URL}")
    installed_sdks_are_the_pinned_ones()
    failed = []
    for scenario in SCENARIOS:
        try:
            scenario()
        except Exception:  # noqa: BLE001 - report every scenario, then fail
            failed.append(scenario.__name__)
            print(f"FAIL {scenario.__name__}")
            traceback.print_exc(file=sys.stdout)
        else:
            print(f"ok   {scenario.__name__}")
    print(f"{len(SCENARIOS) - len(failed)} passed, {len(failed)} failed")
    if failed:
        print("failed: " + ", ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
