"""What looks like a credential in a manifest, which is stored and shown in the clear: those belong in a Secret.

Three signs, each refused wherever the manifest holds a free string a credential could be pasted into (env
values, a reward endpoint's URL, model, data and checkpoint locations, the env of a pod template):

- a variable's name says so (`HF_TOKEN`, `DB_PASSWORD`, `OPENAI_KEY`, `GH_PAT`);
- a URL carries one (`user:password@`, `?api_key=`, an S3 or GCS signature);
- the value is a token that announces itself by its prefix: the providers' API keys and access tokens
  (OpenAI and Anthropic `sk-`, GitHub `ghp_` and kin, GitLab `glpat-`, Hugging Face `hf_`, Slack `xox?-`, AWS
  access key ids, Google API keys, Stripe live keys, a JWT, a PEM private key). The prefixes are the ones each
  provider documents for its secret-scanning partners; the lengths keep a word like `sk-learn` out.
"""

import re

#: Words that mark an environment variable as a credential wherever they stand in its name.
CREDENTIAL_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "ACCESS_KEY", "PRIVATE_KEY", "CREDENTIAL")
#: Last words of a name that mark it as a credential: `OPENAI_KEY`, `GH_PAT` (a personal access token).
CREDENTIAL_LAST_WORDS = ("KEY", "PAT")

#: A URL whose authority carries a password: `scheme://user:password@host`.
URL_PASSWORD = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#@\s]*:[^/?#@\s]+@")
#: Query parameters that carry a credential: `?api_key=...`, `&token=...`, an S3 or Azure signature ...
CREDENTIAL_PARAMETER = re.compile(
    r"[?&;](api[_-]?key|apikey|access[_-]?token|auth[_-]?token|token|secret|client[_-]?secret|password|passwd|"
    r"private[_-]?key|sig|signature|x-amz-signature|x-amz-credential|x-goog-signature|x-goog-credential)=[^&;#\s]",
    re.IGNORECASE,
)
#: Tokens that say what they are by their prefix, not preceded by a letter or digit (`task-...` is no `sk-`).
TOKEN = re.compile(
    r"(?<![A-Za-z0-9])("
    r"sk-(?:proj-|ant-[a-z0-9]+-)?[A-Za-z0-9_-]{20,}"  # OpenAI, Anthropic
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"  # GitHub
    r"|glpat-[A-Za-z0-9_-]{20,}"  # GitLab
    r"|hf_[A-Za-z0-9]{30,}"  # Hugging Face
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack
    r"|(?:AKIA|ASIA)[0-9A-Z]{16}"  # AWS access key id
    r"|AIza[0-9A-Za-z_-]{35}"  # Google API key
    r"|[sr]k_live_[0-9A-Za-z]{20,}"  # Stripe
    r"|eyJ[A-Za-z0-9_-]{10,}\.eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+"  # a JWT (a bearer token)
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
    r")"
)
#: What each kind of token is called in a message, by its first characters.
TOKEN_KINDS = (
    ("sk-ant-", "an Anthropic API key"),
    ("sk-", "an OpenAI-style API key (sk-)"),
    ("gh", "a GitHub token"),
    ("github_pat_", "a GitHub token"),
    ("glpat-", "a GitLab token"),
    ("hf_", "a Hugging Face token"),
    ("xox", "a Slack token"),
    ("AKIA", "an AWS access key id"),
    ("ASIA", "an AWS access key id"),
    ("AIza", "a Google API key"),
    ("sk_live_", "a Stripe key"),
    ("rk_live_", "a Stripe key"),
    ("eyJ", "a JWT"),
    ("-----BEGIN", "a private key"),
)


def credential_name(name: str) -> bool:
    """Whether an environment variable's name says it holds a credential.

    >>> [credential_name(n) for n in ("HF_TOKEN", "OPENAI_KEY", "GH_PAT", "WANDB_MODE", "KEYS_DIR")]
    [True, True, True, False, False]
    """
    upper = name.upper()
    return any(word in upper for word in CREDENTIAL_WORDS) or upper.rsplit("_", 1)[-1] in CREDENTIAL_LAST_WORDS


def credential_in(value: str) -> str | None:
    """Why `value` looks like it holds a credential, or None: a URL with a password, a secret-looking parameter,
    a token known by its prefix. The message never repeats the value.

    >>> credential_in("https://bob:hunter2@proxy.example.com:3128")
    'a URL with a password (user:password@)'
    >>> credential_in("https://rm.example.com/score?api_key=abc123")
    'a credential parameter (api_key=)'
    >>> credential_in("ghp_" + "a1B2" * 9)
    'a GitHub token'
    >>> credential_in("https://rm.example.com/score?mode=fast") is None
    True
    """
    if URL_PASSWORD.search(value):
        return "a URL with a password (user:password@)"
    found = CREDENTIAL_PARAMETER.search(value)
    if found:
        return f"a credential parameter ({found.group(1)}=)"
    token = TOKEN.search(value)
    if token:
        return next((kind for prefix, kind in TOKEN_KINDS if token.group(1).startswith(prefix)), "an API key")
    return None
