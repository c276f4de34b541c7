#!/usr/bin/env python3
"""make_frame_corpus.py - writes the wire-protocol fuzzing seed corpus
(tests/corpus/frame) for tests/fuzz_frame.c.

One valid frame of each type (libipc/proto.h), a TOKEN and a FINAL record
payload, a stream of several frames back to back, and a few broken ones.
Standard library only; the output is deterministic.

    python3 tests/corpus/make_frame_corpus.py [OUTDIR]
"""
import os
import struct
import sys

HELLO, SUBMIT, CANCEL, RING_WAKE, ADMIN = 1, 2, 3, 4, 5
WELCOME, ERROR, ADMIN_REPLY = 0x81, 0x82, 0x83
CHAT, LOGPROBS, IGNORE_EOS, SEED, GRAMMAR, MODEL = 1, 2, 4, 8, 16, 32
GRAMMAR_GBNF = 1
E_BUSY, E_NOTFOUND, E_INTERNAL = 7, 10, 13
FIN_STOP, FIN_ERROR = 1, 4
MAX_PAYLOAD = 1 << 20


def frame(ftype, payload, reserved=0, length=None):
    n = len(payload) if length is None else length
    return struct.pack("<IHH", n, ftype, reserved) + payload


def pstr(s):
    b = s.encode() if isinstance(s, str) else s
    return struct.pack("<I", len(b)) + b


def hello(version=1, ring_bytes=1 << 16):
    return frame(HELLO, struct.pack("<IIII", version, 0, ring_bytes, 0))


def welcome():
    fixed = struct.pack("<12I", 1, 0, 1 << 20, 4242, 8, 65536, 4096, 2048, 8192, 49152, 17, 0)
    return frame(WELCOME, fixed + pstr("SmolLM2-135M-Instruct") + pstr("cpu") + pstr("chatml"))


def submit_fixed(sid=1, flags=0, max_tokens=64, temperature=0.8, top_p=0.95, min_p=0.05,
                 repeat_penalty=1.1, n_stops=0, seed=0, n_messages=0):
    return struct.pack("<QIiiiffffiffIQII", sid, flags, 0, max_tokens, 40, temperature, top_p,
                       min_p, repeat_penalty, 64, 0.0, 0.0, n_stops, seed, n_messages, 0)


def submit(prompt="Once upon a time", stops=("\n\n",), grammar=None, model=None, **kw):
    """GRAMMAR (GBNF text) and MODEL (a name) set their flags and follow the stops."""
    flags = kw.pop("flags", 0) | (GRAMMAR if grammar is not None else 0) \
        | (MODEL if model is not None else 0)
    body = submit_fixed(n_stops=len(stops), flags=flags, **kw) + pstr(prompt)
    body += b"".join(pstr(s) for s in stops)
    if grammar is not None:
        body += struct.pack("<II", GRAMMAR_GBNF, 0) + pstr(grammar)
    if model is not None:
        body += pstr(model)
    return frame(SUBMIT, body)


def submit_chat(messages, stops=("User:",), **kw):
    body = submit_fixed(flags=CHAT | kw.pop("flags", 0), n_stops=len(stops),
                        n_messages=len(messages), **kw)
    body += b"".join(struct.pack("<I", role) + pstr(text) for role, text in messages)
    return frame(SUBMIT, body + b"".join(pstr(s) for s in stops))


def cancel(sid):
    return frame(CANCEL, struct.pack("<Q", sid))


def error(sid, code, msg):
    return frame(ERROR, struct.pack("<QII", sid, code, 0) + pstr(msg))


def admin(cmd, arg=""):
    return frame(ADMIN, struct.pack("<I", 0) + pstr(cmd) + pstr(arg))


def admin_reply(code, body):
    return frame(ADMIN_REPLY, struct.pack("<II", code, 0) + pstr(body))


def token_rec(sid, tok, logprob, text):
    b = text.encode()
    return struct.pack("<QifII", sid, tok, logprob, len(b), 0) + b


def final_rec(sid, finish, code, msg=""):
    b = msg.encode()
    return struct.pack("<QIIIIIIQQQII", sid, finish, code, 12, 4, 30, 0, 150, 2000, 90000,
                       len(b), 0) + b


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "frame")
    os.makedirs(out, exist_ok=True)
    chat = submit_chat([(1, "Be brief."), (2, "Hello?"), (3, "")], sid=7,
                       flags=LOGPROBS | SEED, seed=0x1234)
    files = {
        "valid_hello": hello(),
        "valid_welcome": welcome(),
        "valid_submit": submit(),
        "valid_submit_greedy_nostops": submit(prompt="", stops=(), temperature=0.0, top_p=1.0,
                                              min_p=0.0, flags=IGNORE_EOS),
        "valid_submit_chat": chat,
        "valid_submit_model": submit(model="SmolLM2-135M-Instruct"),
        "valid_submit_grammar_model": submit(grammar='root ::= "yes" | "no"', model="gemma-3"),
        "valid_cancel": cancel(5),
        "valid_ring_wake": frame(RING_WAKE, b""),
        "valid_error": error(5, E_BUSY, "queue full"),
        "valid_error_connection": error(0, E_INTERNAL, ""),
        "valid_admin": admin("status"),
        "valid_admin_arg": admin("kill", "3"),
        "valid_admin_reply": admin_reply(0, '{"clients":[]}'),
        "valid_admin_reply_err": admin_reply(E_NOTFOUND, "no such command"),
        "valid_token_record": token_rec(7, 4521, -0.25, "\u00e9t\u00e9"),
        "valid_token_record_heldback": token_rec(7, -1, 0.0, "!"),
        "valid_final_record": final_rec(7, FIN_STOP, 0),
        "valid_final_record_error": final_rec(7, FIN_ERROR, E_INTERNAL, "out of memory"),
        "stream_session": hello() + submit() + chat + frame(RING_WAKE, b"") + cancel(1)
        + admin("ps"),
        "stream_daemon": welcome() + error(3, E_BUSY, "retry") + admin_reply(0, "{}"),
        "bad_truncated_submit": submit()[:-3],
        "bad_partial_header": hello()[:5],
        "bad_header_reserved": frame(CANCEL, struct.pack("<Q", 5), reserved=1),
        "bad_unknown_type": frame(0x84, b""),
        "bad_oversize_len": frame(ADMIN_REPLY, b"", length=MAX_PAYLOAD + 1),
        "bad_trailing_byte": frame(CANCEL, struct.pack("<Q", 5) + b"\0"),
        "bad_nan_temperature": submit(temperature=float("nan")),
        "bad_top_p_zero": submit(top_p=0.0),
        "bad_huge_strlen": frame(ADMIN, struct.pack("<II", 0, 0xffffffff) + b"status"),
        "bad_role": submit_chat([(4, "who am I")]),
        "bad_chat_no_messages": submit_chat([]),
        "bad_id_zero": submit(sid=0),
        "bad_model_empty": submit(model=""),
        "bad_model_nul": submit(model="smol\0lm2"),
        "bad_model_missing": frame(SUBMIT, submit(model="x")[8:-5]),
        "bad_stream_then_garbage": cancel(2) + b"\xff" * 12,
    }
    for name, data in sorted(files.items()):
        assert len(data) < 4096, name
        with open(os.path.join(out, name), "wb") as f:
            f.write(data)
    print("wrote %d files to %s" % (len(files), out))


if __name__ == "__main__":
    main()
