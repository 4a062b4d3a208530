"""Scoring with an HTTP reward service outside the job (`spec.reward.endpoint`).

The protocol, one request per batch of at most `reward.batchSize` samples:

    POST <reward.endpoint.url>
    Content-Type: application/json
    Authorization: Bearer <token>             (only when KUBERL_REWARD_ENDPOINT_TOKEN is set)

    {"items": [{"prompt": "What is 2+3?", "response": "5", "sample": {"answer": "5"}}, ...]}

answered by

    200 OK
    {"scores": [1.0, ...]}

with one score per item, in the order of the items. A score is a finite number; `null` (or
anything else that is not a number) fails that one sample and keeps the others. `sample` is the
prompt's data record as the dataset holds it (values JSON cannot carry are sent as strings).

Failures. Connection errors, timeouts, HTTP 408, 429 and 5xx, a body that is not JSON and a
`scores` list of the wrong length are retried up to `maxRetries` times after 0.5 s, 1 s, 2 s ...
(doubling, at most 30 s). Any other 4xx is not retried: the request itself is wrong and will not
improve, and neither is an answer over MAX_RESPONSE_BYTES.

Bounds. `timeoutSeconds` is a wall-clock deadline for the whole request, from connecting to the
last byte of the answer: a watchdog shuts the socket down when it passes, so a service that drips
one byte just inside every read timeout (a per-read timeout would never fire) is cut off. The
answer is read in chunks, at most MAX_RESPONSE_BYTES of it (refused at once when Content-Length
says more), so a runaway or hostile service cannot fill the worker's memory. A batch that still fails
gets score 0.0 with the reason in `RewardResult.error` for each of its samples — the controller
counts them and drops their gradient — and the job goes on.

Redirects are not followed: a 3xx fails the batch without a retry, naming where it pointed. The
token would otherwise travel to whatever address the answer names (urllib keeps the header on a
redirect, to another host or to plain http); set `reward.endpoint.url` to the final address.

Concurrency: at most `maxConcurrency` requests in flight per reward worker, whatever number of
threads ask (a semaphore), so a pool of N workers puts at most N * maxConcurrency requests on the
service.

The token: the operator puts the key `token` of the Secret named by `reward.endpoint.secretRef`
into the reward workers' environment as KUBERL_REWARD_ENDPOINT_TOKEN; locally, export it before
`kuberl run`. It is read once when the worker starts and never logged.
"""

import contextlib
import http.client
import json
import logging
import math
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from kuberl.api.contract import REWARD_ENDPOINT_TOKEN_ENV
from kuberl.api.rules import ENDPOINT_BACKOFF_CAP_SECONDS
from kuberl.api.spec import RewardEndpointSpec
from kuberl.runtime.rewards.functions import RewardResult

log = logging.getLogger(__name__)

TOKEN_ENV = REWARD_ENDPOINT_TOKEN_ENV
RETRYABLE_STATUS = frozenset({408, 429})  # and every 5xx
#: The largest answer read. {"scores": [...]} for the largest batch (65536 items) is about 1.5 MB.
MAX_RESPONSE_BYTES = 16 << 20
_READ_CHUNK = 64 << 10


class EndpointCallError(Exception):
    """One request to the reward service failed; `retryable` says whether sending it again may help."""

    def __init__(self, reason: str, retryable: bool) -> None:
        super().__init__(reason)
        self.retryable = retryable


def backoff_delay(retry: int, base_s: float = 0.5, cap_s: float = ENDPOINT_BACKOFF_CAP_SECONDS) -> float:
    """Seconds to wait before retry number `retry` (0 for the first retry): base * 2^retry, at most cap."""
    return min(cap_s, base_s * 2.0**retry)


def _json_default(value: Any) -> Any:
    """numpy/torch scalars and arrays as numbers and lists; anything else JSON cannot carry as its str."""
    for method in ("item", "tolist"):
        convert = getattr(value, method, None)
        if callable(convert):
            try:
                return convert()
            except (TypeError, ValueError, RuntimeError):
                pass
    return str(value)


def request_body(prompts: list[str], completions: list[str], samples: list[dict[str, Any]]) -> bytes:
    """The JSON body for one batch: {"items": [{"prompt", "response", "sample"}, ...]}."""
    if not len(prompts) == len(completions) == len(samples):
        raise ValueError(
            f"{len(prompts)} prompts, {len(completions)} completions, {len(samples)} samples; they must pair up"
        )
    items = [
        {"prompt": prompt, "response": completion, "sample": sample}
        for prompt, completion, sample in zip(prompts, completions, samples, strict=True)
    ]
    return json.dumps({"items": items}, default=_json_default).encode("utf-8")


def _preview(data: bytes | str, limit: int = 120) -> str:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _as_score(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def parse_scores(body: bytes, expected: int, url: str) -> list[RewardResult]:
    """RewardResults from a response body; raises EndpointCallError (retryable) when the body is unusable."""
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise EndpointCallError(f"{url} answered with a body that is not JSON: {_preview(body)!r}", True) from None
    scores = payload.get("scores") if isinstance(payload, dict) else None
    if not isinstance(scores, list):
        raise EndpointCallError(
            f'{url} answered {_preview(body)!r}; expected {{"scores": [...]}} with one score per item', True
        )
    if len(scores) != expected:
        raise EndpointCallError(
            f"{url} returned {len(scores)} scores for {expected} items; the service must return one score "
            "per item, in the order sent",
            True,
        )
    results = []
    for value in scores:
        score = _as_score(value)
        if score is None:
            results.append(RewardResult(0.0, {}, error=f"{url} returned score {_preview(repr(value))} for this sample"))
        else:
            results.append(RewardResult(score))
    return results


class _RefuseRedirects(urllib.request.HTTPRedirectHandler):
    """A 3xx comes back as an HTTPError instead of a new request (that would carry the token along)."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def _watched(base: type[http.client.HTTPConnection], deadline: float) -> type[http.client.HTTPConnection]:
    """`base` whose socket is shut down at `deadline` (time.monotonic()), whatever is reading from it."""

    class WatchedConnection(base):  # type: ignore[valid-type,misc]
        def connect(self) -> None:
            given: float | None = getattr(self, "timeout", None)  # urllib's per-operation timeout
            self.timeout = max(0.001, min(given or math.inf, deadline - time.monotonic()))
            super().connect()
            # urllib drops its reference to the socket once the headers are in; the body is read through it
            watched = self.sock
            self._watchdog = threading.Timer(max(0.0, deadline - time.monotonic()), _shut_down, (watched,))
            self._watchdog.daemon = True
            self._watchdog.start()

        def close(self) -> None:
            watchdog = getattr(self, "_watchdog", None)
            if watchdog is not None:
                watchdog.cancel()
            super().close()

    return WatchedConnection


def _shut_down(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _WatchedHTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPConnection, self._deadline), req)


class _WatchedHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, deadline: float) -> None:
        super().__init__()
        self._deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_watched(http.client.HTTPSConnection, self._deadline), req)


def _opener(deadline: float) -> urllib.request.OpenerDirector:
    """urllib without redirects, every connection cut at `deadline` (proxies from the environment still apply)."""
    return urllib.request.build_opener(_RefuseRedirects, _WatchedHTTPHandler(deadline), _WatchedHTTPSHandler(deadline))


def read_capped(response: Any, url: str, limit: int = MAX_RESPONSE_BYTES) -> bytes:
    """The body of `response`, read in chunks; EndpointCallError (not retried) beyond `limit` bytes."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > limit:
        raise EndpointCallError(f"{url} announced an answer of {int(declared)} bytes; at most {limit} are read", False)
    chunks, size = [], 0
    while chunk := response.read(_READ_CHUNK):
        size += len(chunk)
        if size > limit:
            raise EndpointCallError(f"{url} answered with more than {limit} bytes; the rest was not read", False)
        chunks.append(chunk)
    return b"".join(chunks)


class RewardEndpointClient:
    """Calls one reward service; thread-safe, never raises for a failed call (failed samples carry the reason)."""

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        max_retries: int = 3,
        max_concurrency: int = 8,
        token: str | None = None,
        backoff_base_s: float = 0.5,
        backoff_cap_s: float = ENDPOINT_BACKOFF_CAP_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self._token = token
        self._backoff = (backoff_base_s, backoff_cap_s)
        self._sleep = sleep
        self._in_flight = threading.BoundedSemaphore(max_concurrency)

    @classmethod
    def from_spec(cls, spec: RewardEndpointSpec, env: Mapping[str, str] = os.environ) -> "RewardEndpointClient":
        return cls(
            spec.url,
            timeout_s=spec.timeout_seconds,
            max_retries=spec.max_retries,
            max_concurrency=spec.max_concurrency,
            token=env.get(TOKEN_ENV) or None,
        )

    def _post(self, body: bytes, expected: int) -> list[RewardResult]:
        """One request, cut off at timeoutSeconds of wall clock; raises EndpointCallError."""
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(self.url, data=body, headers=headers, method="POST")
        with self._in_flight:
            deadline = time.monotonic() + self.timeout_s
            try:
                with _opener(deadline).open(request, timeout=self.timeout_s) as response:
                    answer = read_capped(response, self.url)
                if time.monotonic() >= deadline:  # cut off: what arrived may end early without an error
                    raise self._late()
            except urllib.error.HTTPError as error:
                raise self._refused(error) from None
            except (OSError, http.client.HTTPException) as error:  # URLError is an OSError
                if time.monotonic() >= deadline:
                    raise self._late() from None
                reason = getattr(error, "reason", error)
                if isinstance(reason, TimeoutError):
                    raise self._late() from None
                raise EndpointCallError(f"cannot reach {self.url}: {reason}", True) from None
        return parse_scores(answer, expected, self.url)

    def _late(self) -> EndpointCallError:
        return EndpointCallError(
            f"no complete answer from {self.url} within {self.timeout_s:g} s (reward.endpoint.timeoutSeconds)", True
        )

    def _refused(self, error: urllib.error.HTTPError) -> EndpointCallError:
        if 300 <= error.code < 400:
            where = error.headers.get("Location", "?")
            return EndpointCallError(
                f"HTTP {error.code} from {self.url} redirects to {where}; redirects are not followed (the token "
                "would go along): set reward.endpoint.url to the final address",
                False,
            )
        retryable = error.code in RETRYABLE_STATUS or error.code >= 500
        detail = _preview(error.read(1024) or b"")
        return EndpointCallError(f"HTTP {error.code} from {self.url}: {detail!r}", retryable)

    def score(self, prompts: list[str], completions: list[str], samples: list[dict[str, Any]]) -> list[RewardResult]:
        """One batch in one request, retried with backoff; a batch that keeps failing fails its samples."""
        if not completions:
            return []
        body = request_body(prompts, completions, samples)
        attempts = 0
        while True:
            attempts += 1
            try:
                return self._post(body, len(completions))
            except EndpointCallError as error:
                if not error.retryable or attempts > self.max_retries:
                    reason = f"reward endpoint failed after {attempts} attempt(s): {error}"
                    log.warning("%d samples scored 0.0: %s", len(completions), reason)
                    return [RewardResult(0.0, {}, error=reason) for _ in completions]
                self._sleep(backoff_delay(attempts - 1, *self._backoff))

    def score_chunked(
        self, prompts: list[str], completions: list[str], samples: list[dict[str, Any]], batch_size: int
    ) -> list[RewardResult]:
        """Many samples as requests of at most `batch_size` items, up to maxConcurrency at once; results in order."""
        starts = range(0, len(completions), batch_size)
        if len(starts) <= 1:
            return self.score(prompts, completions, samples)
        chunks = [
            (prompts[s : s + batch_size], completions[s : s + batch_size], samples[s : s + batch_size]) for s in starts
        ]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrency, len(chunks))) as executor:
            parts = list(executor.map(lambda chunk: self.score(*chunk), chunks))
        return [result for part in parts for result in part]
