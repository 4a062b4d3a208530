"""Request bodies the Kubernetes API server reads back exactly as they were written.

The API server decodes many bodies (server-side apply's `application/apply-patch+yaml`, merge patches) with
go-yaml, a YAML 1.1 parser, and JSON is YAML only in part:
- Python's `json.dumps` writes a character beyond U+FFFF (an emoji in a log line, "GLHF! 🏖️" in every gloo
  error) as a surrogate pair `\\ud83c\\udfd6`, and go-yaml refuses each half: "found invalid Unicode character
  escape code". A status carrying such a message was refused forever, so the operator never restarted a job
  whose RayJob failed with a gloo error.
- Written as it is (UTF-8), the character is fine, but then C1 controls (U+007F-U+009F) are not printable YAML,
  and U+0085, U+2028 and U+2029 are YAML 1.1 line breaks that a quoted scalar folds into a space.
So: UTF-8 for everything but those, which stay `\\uXXXX` escapes (all in the Basic Plane, so no pair); a lone
surrogate (text decoded with `surrogateescape`) has no character to be and becomes U+FFFD.

Standard library only: both the operator and the runtime send such bodies.
"""

import json
import re
from typing import Any

#: Characters go-yaml does not take as they are inside a double-quoted scalar, or changes.
_ESCAPED = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def request_body(obj: Any) -> bytes:
    """`obj` as JSON the API server's JSON and YAML decoders both read back unchanged (NaN is refused)."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    text = _LONE_SURROGATE.sub("\ufffd", text)
    return _ESCAPED.sub(lambda found: f"\\u{ord(found.group()):04x}", text).encode("utf-8")
