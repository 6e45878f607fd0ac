"""The case-file format both tokenizer case generators write (make_tokenizer_cases.py for SmolLM2's BPE,
make_spm_tokenizer_cases.py for Gemma 3's SentencePiece) and tests/support/case_file.hpp reads: tab-separated
fields, text escaped byte by byte, ids space-separated."""

import os


def escape(text):
    """`text`: str (written as UTF-8) or bytes (a detokenization that need not be UTF-8)."""
    out = []
    for b in text if isinstance(text, bytes) else text.encode("utf-8"):
        c = chr(b)
        if c == "\\":
            out.append("\\\\")
        elif c == "\t":
            out.append("\\t")
        elif c == "\n":
            out.append("\\n")
        elif c == "\r":
            out.append("\\r")
        elif 0x20 <= b < 0x7F:
            out.append(c)
        else:
            out.append("\\x%02x" % b)
    return "".join(out)


def ids_field(ids):
    return " ".join(str(i) for i in ids)


def cached_model_path(env_var, file_name):
    """scripts/fetch_model.sh's rule: $env_var, else ${KVFUSE_CACHE_DIR:-${XDG_CACHE_HOME:-~/.cache}/kvfuse}/file_name."""
    if os.environ.get(env_var):
        return os.environ[env_var]
    cache = os.environ.get("KVFUSE_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvfuse")
    return os.path.join(cache, file_name)
