"""OpenAI Predicted Outputs: the request's `prediction` field to the engine's draft tokens.

Shape (OpenAI's): `{"type": "content", "content": str | [{"type": "text", "text": str}, ...]}`.
Text parts are concatenated as they are (no separator). The text is tokenized as plain text:
no BOS, no special-token parsing (a `<|im_end|>` in a predicted file is text, as it would be
in the model's output). The ids become `SamplingParams.prediction`, the draft source of the
request's speculative decoding; they never change what is generated, only how fast.

Every malformed value is a 400 `invalid_request_error` with `param: "prediction"`.
"""

from __future__ import annotations

from typing import Any

from app.server.errors import APIError, bad_request

SHAPE = ('{"type": "content", "content": <string or list of {"type": "text", "text": '
         '<string>}>}')


SHAPE_OF = {
    "prediction": SHAPE,
    "prediction.type": "'content'",
    "prediction.content": 'a string or a list of {"type": "text", "text": <string>} parts',
}


def _invalid(what: str, value: Any) -> APIError:
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return bad_request(f"Invalid value for '{what}': expected {SHAPE_OF[what]} (got {shown}).",
                       param="prediction")


def prediction_text(value: Any) -> str | None:
    """The predicted text of a request's `prediction` (None when absent or null).

    Raises APIError 400 (param "prediction") for anything but the shape above: not an object,
    `type` other than "content", `content` missing or neither a string nor a list of text
    parts.
    """
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _invalid("prediction", value)
    if value.get("type") != "content":
        raise _invalid("prediction.type", value.get("type"))
    content = value.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid("prediction.content", content)
    texts = []
    for part in content:
        if (not isinstance(part, dict) or part.get("type") != "text"
                or not isinstance(part.get("text"), str)):
            raise _invalid("prediction.content", part)
        texts.append(part["text"])
    return "".join(texts)


def prediction_ids(engine: Any, value: Any, context_length: int) -> list[int] | None:
    """Token ids of `value`'s text for `SamplingParams.prediction`: None when there is no
    prediction or its text is empty; at most `context_length` ids (no output is longer).

    Raises APIError 400 as `prediction_text` does.
    """
    text = prediction_text(value)
    if not text:
        return None
    ids = engine.tokenizer.encode(text, add_special=False, parse_special=False)
    return list(ids[:context_length]) or None
