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


@pytest.mark.parametrize(
    ("text", "part"),
    [
        pytest.param("models/bert", "no scheme", id="no-scheme"),
        pytest.param("gs://bucket/x", "scheme 'gs'", id="unknown-scheme"),
        pytest.param(" s3://b/x", "white space", id="space"),
        pytest.param("s3://B_/x", "bucket 'B_'", id="bad-bucket"),
        pytest.param("s3://key:secret@bucket/x", "credentials", id="s3-credentials"),
        pytest.param("s3://bucket/a//b", "'//'", id="s3-empty-part"),
        pytest.param("s3://bucket/x?versionId=1", "query", id="s3-query"),
        pytest.param("oci://registry.local/bert:v1", "no digest", id="oci-tag-only"),
        pytest.param("oci://registry.local/bert", "no digest", id="oci-neither"),
        pytest.param("oci://registry.local/bert@sha256:abc", "digest 'sha256:abc'", id="oci-short"),
        pytest.param(f"oci://registry.local/Bert@sha256:{HEX}", "repository 'Bert'", id="oci-repo"),
        pytest.param(f"oci://u:p@registry.local/b@sha256:{HEX}", "credentials", id="oci-userinfo"),
        pytest.param(f"oci://registry.local/b:-x@sha256:{HEX}", "tag '-x'", id="oci-tag"),
        pytest.param(f"oci://registry.local@sha256:{HEX}", "no repository", id="oci-no-repo"),
        pytest.param(f"oci://reg_istry/b@sha256:{HEX}", "registry 'reg_istry'", id="oci-bad-host"),
        pytest.param("https://files.local/model.onnx", "--digest", id="https-no-sha"),
        pytest.param("https://files.local/m.onnx#x", "fragment", id="https-other-fragment"),
        pytest.param("https://files.local/model.onnx#sha256=12", "digest", id="https-short-sha"),
        pytest.param(f"https://files.local/#sha256={HEX}", "file name", id="https-no-file"),
        pytest.param(f"https://u:p@files.local/m#sha256={HEX}", "credentials", id="https-userinfo"),
        pytest.param(f"http://files.local/m#sha256={HEX}", "--allow-http", id="plain-http"),
        pytest.param("hf://org/name", "no revision", id="hf-no-revision"),
        pytest.param("hf://org/name@", "no revision", id="hf-empty-revision"),
        pytest.param("hf://name@main", "hf://org/name@revision", id="hf-no-org"),
        pytest.param("hf://org/na--me@main", "'--'", id="hf-double-dash"),
        pytest.param("hf://org/name@a..b", "revision 'a..b'", id="hf-bad-revision"),
    ],
)
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
