"""Text PostgreSQL cannot store (NUL, unpaired surrogates) is kept without loss: escaped where JSON reaches the
database, read back as it came (journal.text). Runs on SQLite and on Postgres."""

import json
import uuid

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from journal.chain import chain_verify
from journal.models import JournalEvent
from journal.selectors import events_for_run, replay_rows_for_run
from journal.services import NewEvent, dumps, events_append
from journal.text import (
    ESCAPED,
    StorableJSONDecoder,
    StorableJSONEncoder,
    escape,
    first_unstorable,
    unescape,
    utf8_safe_json,
)
from runs.models import Run
from tests.helpers import drive_to_end, echo_step, make_run

NASTY = {"te\x00xt": ["a\x00b", "lone \ud800 high", "\udfff", ESCAPED + "already", "c:\\new\\u0000", "plain"]}

# Any text a peer can send: every code point, surrogates included, and strings that look escaped already.
any_text = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0x10FFFF)) | st.builds(
    lambda tail: ESCAPED + tail, st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=0xFFFF))
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | any_text,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(any_text, inner, max_size=4),
    max_leaves=12,
)


def storable(value) -> bool:
    return first_unstorable(value) is None


# --- the escaping itself ------------------------------------------------------------------------------


@given(json_values)
def test_escape_then_unescape_gives_back_any_json_value(value):
    escaped = escape(value)
    assert storable(escaped)
    assert unescape(escaped) == value


@given(json_values, st.booleans())
# Found by hypothesis: a lone high surrogate then a lone low one, which JSON's \u escapes would join into one
# astral character if the encoder read the value back from its ensure_ascii text.
@example(["\ud800\udc00"], True)
@example(["\ud800\udc00"], False)
def test_what_the_encoder_writes_the_decoder_reads_back(value, ensure_ascii):
    text = json.dumps(value, cls=StorableJSONEncoder, ensure_ascii=ensure_ascii)
    assert storable(json.loads(text))  # what the database is handed
    assert json.loads(text, cls=StorableJSONDecoder) == value


@given(st.text(alphabet=st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00\ue000")))
def test_text_with_nothing_to_escape_is_stored_as_it_is(text):
    assert escape(text) == text
    assert dumps({"t": text}) == json.dumps({"t": text}, separators=(",", ":"), sort_keys=True)


def test_keys_and_strings_that_already_look_escaped_are_escaped_too():
    escaped = escape(NASTY)
    assert all(key.startswith(ESCAPED) for key in escaped)
    assert escaped[ESCAPED + "te\\u0000xt"][3] == ESCAPED + ESCAPED + "already"
    assert escaped[ESCAPED + "te\\u0000xt"][4] == "c:\\new\\u0000"  # a plain backslash needs nothing
    assert unescape(escaped) == NASTY


def test_json_for_a_page_writes_a_lone_surrogate_as_its_escape():
    text = utf8_safe_json(json.dumps({"t": "a\ud800b\x00"}, ensure_ascii=False))
    assert text == '{"t": "a\\ud800b\\u0000"}'
    text.encode("utf-8")
    assert json.loads(text) == {"t": "a\ud800b\x00"}


def test_the_first_unstorable_text_is_named_by_where_it_is():
    assert first_unstorable({"input": {"ok": "fine", "note": ["x", "a\x00"]}}) == (
        "input.note[1]",
        "holds a NUL character (U+0000), which cannot be stored",
    )
    loc, msg = first_unstorable({"steps": [{"id": "a", "pro\ud800mpt": 1}]})
    assert loc == "steps[0].pro\\ud800mpt" and msg.startswith("the key holds an unpaired surrogate (U+D800)")
    assert first_unstorable({"emoji": "\U0001f600", "cjk": "中文", "private": "\ue000"}) is None


# --- in the database ------------------------------------------------------------------------------


@pytest.mark.django_db
def test_a_journal_payload_with_unstorable_text_reads_back_as_it_came_and_the_chain_holds():
    run_id = uuid.uuid4()
    events_append(
        run_id=run_id,
        events=[
            NewEvent("note", payload={"n": 1}),
            NewEvent("step_completed", "s", 1, NASTY),
            NewEvent("note", payload={"after": True}),
        ],
    )
    assert [e.payload for e in events_for_run(run_id=run_id)] == [{"n": 1}, NASTY, {"after": True}]
    assert [row.payload for row in replay_rows_for_run(run_id=run_id)][1] == NASTY  # the executor's replay read
    assert JournalEvent.objects.get(run_id=run_id, seq=2).payload == NASTY
    report = chain_verify(run_id=run_id)
    assert report.ok and report.count == 3, report


@pytest.mark.django_db
def test_a_run_whose_input_and_output_hold_unstorable_text_succeeds_with_them_as_they_came():
    said = "zero\x00byte and \ud800 alone"
    run = make_run(steps=[echo_step("only", said="{{ input.text }}")], input={"text": said, "k\x00": "v"})
    drive_to_end(run)
    run = Run.objects.get(id=run.id)
    assert run.status == "succeeded", run.error
    assert run.input == {"text": said, "k\x00": "v"}
    assert run.output["said"] == said
    completed = JournalEvent.objects.get(run_id=run.id, kind="step_completed")
    assert completed.payload["output"]["said"] == said
    assert chain_verify(run_id=run.id, expect_head=(run.journal_head_seq, run.journal_head_hash)).ok


@pytest.mark.django_db
def test_a_key_lookup_into_a_payload_reads_the_text_back_as_it_came():
    # What the waterfall's markers read (values_list("payload__why")): SQLite answers it with the bare string.
    run_id = uuid.uuid4()
    events_append(run_id=run_id, events=[NewEvent("run_redriven", payload={"why": "a\x00b \ud800", "by": "x"})])
    rows = JournalEvent.objects.filter(run_id=run_id).values_list("payload__why", "payload__by")
    assert list(rows) == [("a\x00b \ud800", "x")]
