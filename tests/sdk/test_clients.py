"""Real clients against the gateway: the official OpenAI and Anthropic Python SDKs.

tests/tests/sdk_clients.rs starts a mock engine for each of two sites, a gateway in front of
them (with a tag key, so stored ids carry a mac), then runs this file with:

    GRID_ROUTE_GATEWAY_URL   http://IP:PORT of the gateway
    GRID_ROUTE_ENGINES       site=engine pairs, comma-separated: which mock engine serves
                             each site (an engine starts each reply with `[its name]`)
    GRID_ROUTE_MODEL         the model the engines serve

Each scenario is one function named as the behaviour it checks. The clients validate every
answer, streamed events included, against the SDKs' own types (`_strict_response_validation`)
and never retry, so an answer the SDK could not parse, or a failure hidden by a retry, fails
here. `main()` runs every scenario and exits 1 naming those that failed.
"""

import os
import re
import sys
import traceback
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
