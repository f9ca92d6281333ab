"""IncrementalDetokenizer: split UTF-8 characters, stop strings across tokens, hold-back."""

from __future__ import annotations

from app.engine.detokenizer import IncrementalDetokenizer

# A tiny byte vocabulary: ids 0-2 split the 4-byte emoji U+1F600.
VOCAB: dict[int, bytes] = {
    0: b"\xf0\x9f",
    1: b"\x98",
    2: b"\x80",
    3: b"Hello",
    4: b" world",
    5: b"</",
    6: b"en",
    7: b"d>",
    8: b"x",
    9: b"e",
    10: b"\xff",  # never valid UTF-8
    11: b"a</end>b",
    12: b"STOP",
    13: b"!",
    14: b"\xc3",  # first half of "é"
    15: b"\xa9",  # second half of "é"
}


def make(stop=()) -> IncrementalDetokenizer:
    return IncrementalDetokenizer(VOCAB.__getitem__, stop)


def push_all(d: IncrementalDetokenizer, ids: list[int]) -> list[str]:
    return [d.push(i) for i in ids]


def test_plain_text_streams_immediately():
    d = make()
    assert push_all(d, [3, 4]) == ["Hello", " world"]
    assert d.flush() == ""
    assert d.text == "Hello world"
    assert not d.stopped


def test_emoji_split_over_three_tokens_is_emitted_once_whole():
    d = make()
    assert push_all(d, [3, 0, 1, 2, 13]) == ["Hello", "", "", "😀", "!"]
    assert d.flush() == ""
    assert d.text == "Hello😀!"
    assert d.text.count("😀") == 1


def test_two_byte_character_split():
    d = make()
    assert push_all(d, [14, 15]) == ["", "é"]


def test_incomplete_utf8_at_end_is_dropped_on_flush():
    # Generation cut inside the emoji (e.g. by max_tokens): its first bytes never show.
    d = make()
    assert push_all(d, [3, 0, 1]) == ["Hello", "", ""]
    assert d.flush() == ""
    assert d.text == "Hello"


def test_incomplete_tail_is_dropped_but_held_stop_prefix_is_released():
    # "</" is held back as a possible stop string; the lone lead byte after it is dropped.
    d = make(stop=["</end>"])
    assert push_all(d, [3, 5, 14]) == ["Hello", "", ""]
    assert d.flush() == "</"
    assert d.text == "Hello</"


def test_invalid_byte_is_emitted_as_replacement_not_held():
    d = make()
    assert push_all(d, [10, 3]) == ["\ufffd", "Hello"]
    # An incomplete lead byte followed by ASCII can never complete: replaced right away.
    d = make()
    assert push_all(d, [0, 8]) == ["", "\ufffdx"]


def test_stop_string_split_across_three_tokens_is_never_emitted():
    d = make(stop=["</end>"])
    out = push_all(d, [3, 5, 6, 7, 4])
    assert out == ["Hello", "", "", "", ""]
    assert d.stopped
    assert d.stop_matched == "</end>"
    assert d.text == "Hello"
    assert d.flush() == ""
    assert "</end>" not in "".join(out)


def test_held_back_prefix_is_flushed_at_end():
    d = make(stop=["</end>"])
    assert push_all(d, [3, 5, 9]) == ["Hello", "", ""]  # "</e" could still become "</end>"
    assert not d.stopped
    assert d.flush() == "</e"
    assert d.text == "Hello</e"


def test_failed_partial_match_is_released_on_the_breaking_token():
    d = make(stop=["</end>"])
    assert d.push(5) == ""
    assert d.push(8) == "</x"
    assert not d.stopped
    assert d.flush() == ""


def test_two_stop_strings_completed_by_one_token_earliest_start_wins():
    # "d>" and "</end>" both complete on the last token; "</end>" starts first.
    d = make(stop=["d>", "</end>"])
    assert push_all(d, [3, 5, 6, 7]) == ["Hello", "", "", ""]
    assert d.stop_matched == "</end>"
    assert d.text == "Hello"


def test_two_stop_strings():
    # Second stop string matches while the first is a held-back partial.
    d = make(stop=["</end>", "STOP"])
    assert push_all(d, [3, 5]) == ["Hello", ""]
    assert d.push(12) == "</"
    assert d.stopped
    assert d.stop_matched == "STOP"
    assert d.text == "Hello</"
    # The other stop string alone.
    d = make(stop=["</end>", "STOP"])
    assert push_all(d, [3, 5, 6, 7]) == ["Hello", "", "", ""]
    assert d.stop_matched == "</end>"
    assert d.text == "Hello"


def test_stop_string_inside_one_token_with_text_around_it():
    d = make(stop=["</end>"])
    assert d.push(3) == "Hello"
    assert d.push(11) == "a"
    assert d.stopped
    assert d.push(3) == ""
    assert d.flush() == ""
    assert d.text == "Helloa"


def test_hold_back_only_the_matching_suffix():
    # "x</" : "x" is safe, "</" could still start "</end>".
    d = make(stop=["</end>"])
    assert d.push(8) == "x"
    assert d.push(5) == ""
    assert d.push(13) == "</!"


def test_empty_stop_strings_are_ignored():
    d = make(stop=[""])
    assert push_all(d, [3, 4]) == ["Hello", " world"]
    assert not d.stopped
