"""Hash formats: VerneMQ's $6$ (a single SHA-512, built here from the format's definition)
and $scrypt$ (checked against RFC 7914's published vector)."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest

from plugins.passwd.hashes import (
    SCRYPT_N,
    SCRYPT_P,
    SCRYPT_R,
    HashError,
    ScryptHash,
    Sha512Hash,
    make_hash,
    parse_hash,
)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def vernemq_line_hash(password: bytes, salt: bytes) -> str:
    """What vmq-passwd writes: $6$<base64(salt)>$<base64(SHA-512(password ‖ salt))>."""
    return f"$6${b64(salt)}${b64(hashlib.sha512(password + salt).digest())}"


# A fixed vector: 12 salt bytes as vmq-passwd draws them, the digest computed by hand.
VMQ_SALT = bytes(range(1, 13))
VMQ_HASH = vernemq_line_hash(b"s3cr3t", VMQ_SALT)


def test_vernemq_vector_is_what_the_format_says():
    assert VMQ_HASH.startswith("$6$AQIDBAUGBwgJCgsM$")  # base64 of bytes 1..12
    digest = base64.b64decode(VMQ_HASH.split("$")[3])
    assert digest == hashlib.sha512(b"s3cr3t" + VMQ_SALT).digest()
    assert len(VMQ_HASH.split("$")[3]) == 88  # 64 bytes, padded base64


def test_vernemq_hash_verifies():
    parsed = parse_hash(VMQ_HASH)
    assert isinstance(parsed, Sha512Hash)
    assert parsed.cheap
    assert parsed.salt == VMQ_SALT
    assert parsed.verify(b"s3cr3t")
    assert not parsed.verify(b"s3cr3T")
    assert not parsed.verify(b"")
    assert not parsed.verify(b"s3cr3t" + VMQ_SALT)  # salt is appended, not a second password


def test_vernemq_hash_is_password_then_salt_not_salt_then_password():
    salt_first = f"$6${b64(VMQ_SALT)}${b64(hashlib.sha512(VMQ_SALT + b'pw').digest())}"
    assert not parse_hash(salt_first).verify(b"pw")


def test_vernemq_hash_binary_password():
    password = b"\x00\xff\xfe binary"
    assert parse_hash(vernemq_line_hash(password, b"x" * 12)).verify(password)


def test_rfc7914_scrypt_vector():
    # RFC 7914 section 12: scrypt(P="password", S="NaCl", N=1024, r=8, p=16, dkLen=64).
    key = bytes.fromhex(
        "fdbabe1c9d3472007856e7190d01e9fe7c6ad7cbc8237830e77376634b373162"
        "2eaf30d92e22a3886ff109279d9830dac727afb94a83ee6d8360cbdfa2cc0640"
    )
    parsed = parse_hash(f"$scrypt$n=1024,r=8,p=16${b64(b'NaCl')}${b64(key)}")
    assert isinstance(parsed, ScryptHash)
    assert (parsed.n, parsed.r, parsed.p) == (1024, 8, 16)
    assert parsed.verify(b"password")
    assert not parsed.verify(b"Password")


def test_make_hash_format_and_round_trip():
    text = make_hash(b"correct horse")
    prefix = f"$scrypt$n={SCRYPT_N},r={SCRYPT_R},p={SCRYPT_P}$"
    assert text.startswith(prefix)
    _, _, _, salt, key = text.split("$")
    assert len(base64.b64decode(salt)) == 16
    assert len(base64.b64decode(key)) == 32
    parsed = parse_hash(text)
    assert not parsed.cheap
    assert parsed.encode() == text
    assert parsed.verify(b"correct horse")
    assert not parsed.verify(b"correct horse ")


def test_make_hash_salts_differ():
    assert make_hash(b"same") != make_hash(b"same")


def test_parameters_come_from_the_line():
    text = make_hash(b"pw", n=1024, r=4, p=2)
    assert text.startswith("$scrypt$n=1024,r=4,p=2$")
    parsed = parse_hash(text)
    assert (parsed.n, parsed.r, parsed.p) == (1024, 4, 2)
    assert parsed.verify(b"pw")
    # The same salt and key read with other parameters must not verify.
    assert not parse_hash(text.replace("n=1024", "n=2048")).verify(b"pw")


KEY = b64(b"k" * 32)
SALT = b64(b"s" * 16)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("plaintext", "expected a hash starting with $6$ or $scrypt$"),
        ("", "expected a hash starting with $6$ or $scrypt$"),
        ("$2b$10$abc", "unknown hash scheme $2b$"),
        ("$6$onlysalt", "expected $6$<base64 salt>$<base64 SHA-512 digest>"),
        (f"$6$not base64!${b64(bytes(64))}", "salt is not valid base64"),
        (f"$6${SALT}${b64(bytes(32))}", "SHA-512 digest is 32 bytes, expected 64"),
        (f"$6$${b64(bytes(64))}", "empty salt"),
        (f"$scrypt$n=1024,r=8${SALT}${KEY}", "bad scrypt parameters"),
        (f"$scrypt$n=1024,r=8,p=1,x=2${SALT}${KEY}", "bad scrypt parameters"),
        (f"$scrypt$n=1024,n=1024,p=1${SALT}${KEY}", "bad scrypt parameters"),
        (f"$scrypt$n=-4,r=8,p=1${SALT}${KEY}", "bad scrypt parameters"),
        (f"$scrypt$n=1000,r=8,p=1${SALT}${KEY}", "must be a power of 2"),
        (f"$scrypt$n=1,r=8,p=1${SALT}${KEY}", "must be a power of 2"),
        (f"$scrypt$n=1024,r=0,p=1${SALT}${KEY}", "need r >= 1"),
        (f"$scrypt$n=1024,r=8,p=17${SALT}${KEY}", "p <= 16"),
        (f"$scrypt$n=1048576,r=8,p=1${SALT}${KEY}", "needs more than 64 MiB"),
        (f"$scrypt$n=1024,r=8,p=1${SALT}$%%%", "key is not valid base64"),
        (f"$scrypt$n=1024,r=8,p=1${SALT}${b64(b'short')}", "key is 5 bytes"),
        (f"$scrypt$n=1024,r=8,p=1${SALT}", "expected $scrypt$n=N,r=R,p=P"),
    ],
)
def test_bad_hashes_say_what_is_wrong(text, message):
    with pytest.raises(HashError, match=re.escape(message)):
        parse_hash(text)
