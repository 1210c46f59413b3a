"""Model URIs: the four schemes parsed, and each refusal naming the part at fault."""

from __future__ import annotations

import pytest

from fleetserve_runtime.storage.digests import Digest
from fleetserve_runtime.storage.reasons import FetchFailed, Reason
from fleetserve_runtime.storage.uri import HfUri, HttpsUri, OciUri, S3Uri, parse_uri

HEX = "ab" * 32
DIGEST = Digest(HEX)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("s3://models/bert/v1", S3Uri("models", "bert/v1"), id="s3"),
        pytest.param("s3://models/bert/v1/", S3Uri("models", "bert/v1"), id="s3-trailing-slash"),
        pytest.param("s3://models", S3Uri("models", ""), id="s3-whole-bucket"),
        pytest.param(
            f"oci://registry.local:5000/team/bert:v1@sha256:{HEX}",
            OciUri("registry.local:5000", "team/bert", "v1", DIGEST),
            id="oci-tag-and-digest",
        ),
        pytest.param(
            f"oci://127.0.0.1:5000/bert@sha256:{HEX}",
            OciUri("127.0.0.1:5000", "bert", None, DIGEST),
            id="oci-digest",
        ),
        pytest.param(
            f"https://files.local/m/model.tar.gz#sha256={HEX}",
            HttpsUri("https://files.local/m/model.tar.gz", DIGEST, "model.tar.gz"),
            id="https",
        ),
        pytest.param(
            f"https://files.local/a%20b.onnx?X-Sig=s3cret#sha256={HEX}",
            HttpsUri("https://files.local/a%20b.onnx?X-Sig=s3cret", DIGEST, "a b.onnx"),
            id="https-query-and-quoted-name",
        ),
        pytest.param("hf://org/name@main", HfUri("org/name", "main"), id="hf-branch"),
        pytest.param("hf://org/name@" + "a" * 40, HfUri("org/name", "a" * 40), id="hf-commit"),
        pytest.param("hf://org/name@refs/pr/1", HfUri("org/name", "refs/pr/1"), id="hf-pr"),
    ],
)
def test_parses(text: str, expected: object) -> None:
    """Each scheme's URI parses into its parts, and prints back (an https URL without its pin)."""
    parsed = parse_uri(text)
    assert parsed == expected
    assert str(parsed) == text.rstrip("/").partition("#")[0]


def test_https_sha256_from_the_digest_flag() -> None:
    """Without a #sha256= fragment, an https URI takes --digest as the file's SHA-256."""
    parsed = parse_uri("https://files.local/model.onnx", digest=DIGEST)
    assert parsed == HttpsUri("https://files.local/model.onnx", DIGEST, "model.onnx")
    pinned = parse_uri(f"https://files.local/m.onnx#sha256={'cd' * 32}", digest=DIGEST)
    assert isinstance(pinned, HttpsUri)
    assert pinned.sha256 == Digest("cd" * 32)


# Each refusal: its id | the URI (`{hex}`: a digest's 64 hex digits) | what the message names.
REFUSALS = """
no-scheme | models/bert | no scheme
unknown-scheme | gs://bucket/x | scheme 'gs'
space |  s3://b/x | white space
s3-bad-bucket | s3://B_/x | bucket 'B_'
s3-credentials | s3://key:secret@bucket/x | credentials
s3-empty-part | s3://bucket/a//b | '//'
s3-query | s3://bucket/x?versionId=1 | query
oci-tag-only | oci://registry.local/bert:v1 | no digest
oci-neither | oci://registry.local/bert | no digest
oci-short-digest | oci://registry.local/bert@sha256:abc | digest 'sha256:abc'
oci-no-repository | oci://registry.local@sha256:{hex} | no repository
oci-bad-repository | oci://registry.local/Bert@sha256:{hex} | repository 'Bert'
oci-userinfo | oci://u:p@registry.local/b@sha256:{hex} | credentials
oci-bad-tag | oci://registry.local/b:-x@sha256:{hex} | tag '-x'
oci-bad-host | oci://reg_istry/b@sha256:{hex} | registry 'reg_istry'
https-no-sha | https://files.local/model.onnx | --digest
https-other-fragment | https://files.local/m.onnx#x | fragment
https-short-sha | https://files.local/model.onnx#sha256=12 | digest
https-no-file | https://files.local/#sha256={hex} | file name
https-userinfo | https://u:p@files.local/m#sha256={hex} | credentials
plain-http | http://files.local/m#sha256={hex} | --allow-http
hf-no-revision | hf://org/name | no revision
hf-empty-revision | hf://org/name@ | no revision
hf-no-org | hf://name@main | hf://org/name@revision
hf-double-dash | hf://org/na--me@main | '--'
hf-bad-revision | hf://org/name@a..b | revision 'a..b'
"""
REFUSED = {
    name: (uri.format(hex=HEX), part)
    for name, uri, part in (row.split(" | ") for row in REFUSALS.strip("\n").splitlines())
}


@pytest.mark.parametrize(("text", "part"), REFUSED.values(), ids=REFUSED.keys())
def test_refuses_naming_the_part(text: str, part: str) -> None:
    """A bad URI is an InvalidUri failure whose message names what is wrong with it."""
    with pytest.raises(FetchFailed) as failed:
        parse_uri(text)
    assert failed.value.reason is Reason.INVALID_URI
    assert part in failed.value.message


def test_plain_http_only_when_allowed() -> None:
    """`http://` parses with allow_http, keeping its scheme."""
    parsed = parse_uri(f"http://files.local/m.bin#sha256={HEX}", allow_http=True)
    assert isinstance(parsed, HttpsUri)
    assert parsed.url == "http://files.local/m.bin"


def test_refusal_hides_a_signed_query() -> None:
    """A presigned URL's signature is a credential: the message leaves the query out."""
    with pytest.raises(FetchFailed) as failed:
        parse_uri("https://files.local/model.onnx?X-Amz-Signature=deadbeef")
    assert "deadbeef" not in failed.value.message
