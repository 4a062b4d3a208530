"""api/wire.py: request bodies go-yaml (the API server's YAML 1.1 decoder) reads back unchanged.

What go-yaml refuses or changes is checked on the real API server in
tests/integration/operator/test_operator.py (a RayJob failing with gloo's emoji in its log); here, that the body
holds none of it and still says the same thing as JSON.
"""

import json
import re

import pytest

from kuberl.api.wire import request_body

AWKWARD = {
    "emoji": "GLHF! \U0001f3d6\ufe0f",  # beyond U+FFFF: json.dumps alone writes a surrogate pair
    "colours": "\x1b[36m(ModelWorker pid=123)\x1b[0m",
    "c1 and YAML 1.1 line breaks": "a\x85b\u2028c\u2029d\x7f\x9f",
    "accents": "déjà vu",
}


def test_the_body_says_the_same_as_json_and_holds_no_surrogate_pair_nor_raw_yaml_line_break():
    body = request_body(AWKWARD)
    assert json.loads(body) == AWKWARD
    text = body.decode("utf-8")
    assert not re.search(r"\\u[dD][89abAB][0-9a-fA-F]{2}", text), "a surrogate escape go-yaml refuses"
    assert not re.search("[\x7f-\x9f\u2028\u2029]", text), "a raw character go-yaml refuses or folds"
    assert "\U0001f3d6" in text and "déjà" in text  # the rest as UTF-8


def test_a_lone_surrogate_becomes_the_replacement_character_and_nan_is_refused():
    assert json.loads(request_body({"m": "bad \udcff byte"})) == {"m": "bad \ufffd byte"}
    with pytest.raises(ValueError):
        request_body({"reward": float("nan")})
