#!/usr/bin/env python3
"""Build the small tokenizer.json fixtures and the texts they are checked on.

Writes, next to this script:
  bytelevel_gpt2/tokenizer.json    ByteLevel(use_regex=true) pre-tokenizer
  bytelevel_llama3/tokenizer.json  Split(Llama-3 regex) + ByteLevel, ignore_merges
  bytelevel_qwen2/tokenizer.json   NFC + Split(Qwen2 regex) + ByteLevel, + config
  sp_metaspace/tokenizer.json      stories260K rewritten in the Metaspace
                                   pre-tokenizer / decoder form
  texts_*.json                     the inputs ref_ids.mjs encodes

The byte-level vocabularies are our own: the 256 GPT-2 byte symbols followed
by merges learned greedily from TRAIN below (most frequent pair, ties by the
pair's text).  Everything is deterministic; run it from any directory:
  python3 tests/data/tokenizers/gen_fixtures.py
then produce the reference ids with ref_ids.mjs (see README.md).
"""
import json
import os
import random

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))

PAT_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
PAT_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
              r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
PAT_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

TRAIN = """The little robot walked through the quiet garden every morning. It watched the
flowers open, counted the bees and listened to the birds. "What a wonderful day," it
said, and the gardener laughed: it's the robot's favourite phrase! They'd planted 1234
seeds in 2023; 567 grew into tall plants. Le café était très bon, über alles. Ça va?
Numbers like 3.14159 and 2.71828 appear in maths; so do x = y + 1 and f(x) = x * 2.
    def main():
        return 0
Привет, мир! 你好，世界。日本語のテキスト。 Emoji: 😀👍 and “curly quotes” — dashes.
"""


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def train(n_merges):
    b2u = bytes_to_unicode()
    vocab = [b2u[b] for b in sorted(b2u, key=lambda b: ord(b2u[b]) if ord(b2u[b]) < 256 else 1000 + ord(b2u[b]))]
    words = {}
    for i, w in enumerate(TRAIN.replace("\n", " \n ").split(" ")):
        if not w:
            continue
        word = ("Ġ" if i else "") + "".join(b2u[b] for b in w.encode("utf-8"))
        words[tuple(word)] = words.get(tuple(word), 0) + 1
    merges = []
    known = set(vocab)
    while len(merges) < n_merges:
        counts = {}
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                counts[(a, b)] = counts.get((a, b), 0) + c
        if not counts:
            break
        best = max(sorted(counts), key=lambda p: counts[p])
        merges.append(best)
        if best[0] + best[1] not in known:
            known.add(best[0] + best[1])
            vocab.append(best[0] + best[1])
        nw = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            nw[tuple(out)] = nw.get(tuple(out), 0) + c
        words = nw
    return vocab, merges


def added(id_, content, special=True, normalized=False):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False,
            "rstrip": False, "normalized": normalized, "special": special}


def bpe_model(vocab, merges, ignore_merges=False, pairs=True):
    return {"type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False, "ignore_merges": ignore_merges,
            "vocab": {t: i for i, t in enumerate(vocab)},
            "merges": [list(m) for m in merges] if pairs else [" ".join(m) for m in merges]}


def template(name, id_):
    return {"type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": name, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": name, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": name, "type_id": 1}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {name: {"id": name, "ids": [id_], "tokens": [name]}}}


BYTELEVEL_DEC = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                 "use_regex": True}


def write(rel, obj):
    path = os.path.join(HERE, rel)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=1)
        f.write("\n")


def split_seq(pattern):
    return {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
         "use_regex": False}]}


def base_texts():
    return [
        "Once upon a time, there was a little girl named Lily.",
        "She loved to play outside in the sunshine with her dog.",
        "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX!",
        "I have 3 apples, 12 pears and 1024 grapes; 3.14159 is pi. 1234567890 12345",
        "Wait... what?! (Yes) [no] {maybe} #hash @at $5 100% a&b *star* ~tilde~ `code` a_b-c/d\\e|f",
        "\u201cHello,\u201d she said. \u2018It\u2019s fine.\u2019",
        "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u00e7a va? se\u00f1or",
        "e\u0301 decomposed accent, \u00c5ngstr\u00f6m, \u212b sign, a\u0308\u0301, \u1100\u1161\u11a8",
        "I love pizza \U0001F355 and cats \U0001F431\U0001F44D! family \U0001F468\u200d\U0001F469\u200d\U0001F467",
        "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3002\ud55c\uad6d\uc5b4",
        "\u041f\u0440\u0438\u0432\u0435\u0442 \u043c\u0438\u0440 \u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u0639\u0631\u0628\u064a",
        "a  b   c    d\t\te\n\nf\r\ng \n h",
        "   leading spaces", "trailing spaces   ", " ", "\n", "", "x",
        "Literal <s> and </s> and <unk> in text.", "<s>", "<s>Hello</s>",
        "don't you're we've I'll he'd I'm it's DON'T YOU'RE It'S it\u017fs 'hello' can't",
        "line one\nline two\n\nline four\n", "tabs\tand\ttabs\t",
        "mixed123numbers456and789letters",
        "\u00a0non-breaking\u00a0space and\u2003em space",
        "x = foo(bar, baz) + 42;\n    return x * 2  # comment\n",
        "def f():\n\tpass\n\n\n    \n  end", "Hello\r\nWorld\r\n\r\n  \r\n",
        "  multiple   spaces   between  ", "trailing newline spaces  \n  ",
        "\u00bd \u00b2 \u2163 \u0663\u0664 numbers in other scripts",
        "<|endoftext|> special <|im_start|>user\nhi<|im_end|> <|begin_of_text|><|eot_id|>",
        "!!!??? ...--- \"\"\" '''", "a\u3000b\u2028c\u2029d",
    ]


def random_texts(seed, n, avoid):
    rnd = random.Random(seed)
    pool = list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 3 + \
        [" "] * 30 + list("\t\n\r\n\n") + list(".,;:!?'\"()[]{}<>-_/\\|@#$%^&*~`+=") + [
            "\u00e9", "\u00c5", "\u00df", "\u0301", "\u0308", "\u4e2d", "\u6587", "\u3042",
            "\ud55c", "\u1100", "\u1161", "\u11a8", "\U0001F600", "\U0001F44D", "\u200d",
            "\u00a0", "\u3000", "\u2028", "\u0085", "\ufeff", "\u0663", "\u00bd", "\u2163",
            "\u017f", "\u212b", "\u2019", "\u201c", "\u0627", "\u0915", "\u093f", "'s", "'S",
            "'ll", "'RE", "<s>", "</s>", "<unk>", "<|endoftext|>", "<|im_start|>",
            "<|begin_of_text|>", "<|eot_id|>", "\u2581", "  ", "\n\n", " \n "]
    pool = [p for p in pool if not any(a in p for a in avoid)]
    return ["".join(rnd.choice(pool) for _ in range(rnd.choice([1, 2, 3, 5, 8, 13, 20, 40, 80])))
            for _ in range(n)]


def story():
    return ("Once upon a time, there was a little boy named Tim. Tim had a big red ball. "
            "He liked to play with it every day.\nOne day, Tim went to the park with his "
            "mom. He saw a girl who was sad. \"Why are you sad?\" Tim asked. The girl said, "
            "\"I lost my toy.\"\n\nTim wanted to help. They looked under the trees and "
            "behind the slide. At last they found the toy near the pond!  They were very "
            "happy, and they played together until the sun went down.\n") * 4


def main():
    vocab, merges = train(400)
    n = len(vocab)

    # GPT-2 style: merges as "a b" strings, <|endoftext|> normalized as in GPT-2.
    write("bytelevel_gpt2/tokenizer.json", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n, "<|endoftext|>", normalized=True)],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                           "use_regex": True},
        "decoder": BYTELEVEL_DEC, "model": bpe_model(vocab, merges, pairs=False)})

    # Llama-3 style: Split + ByteLevel, ignore_merges, specials after the vocab.
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"]
    write("bytelevel_llama3/tokenizer.json", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n + i, s) for i, s in enumerate(specials)],
        "normalizer": None, "pre_tokenizer": split_seq(PAT_LLAMA3),
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
             "use_regex": True}, template("<|begin_of_text|>", n)]},
        "decoder": BYTELEVEL_DEC, "model": bpe_model(vocab, merges, ignore_merges=True)})

    # Qwen2 style: NFC + Split + ByteLevel; config names eos, no bos.
    qspecial = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    write("bytelevel_qwen2/tokenizer.json", {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(n + i, s) for i, s in enumerate(qspecial)],
        "normalizer": {"type": "NFC"}, "pre_tokenizer": split_seq(PAT_QWEN2),
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                    "use_regex": False},
        "model": bpe_model(vocab, merges)})
    write("bytelevel_qwen2/tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None,
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}",
        "clean_up_tokenization_spaces": False, "model_max_length": 32768,
        "tokenizer_class": "Qwen2Tokenizer"})

    # stories260K in the Metaspace form (no normalizer; prepend "first").
    with open(os.path.join(ROOT, "models/stories260K/tokenizer.json"), encoding="utf-8") as f:
        sp = json.load(f)
    sp["normalizer"] = None
    sp["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581",
                           "prepend_scheme": "first", "split": False}
    write("sp_metaspace/tokenizer.json", sp)

    base = base_texts()
    # The JS reference follows JavaScript, not Oniguruma, in two places:
    # GPT-2's built-in regex uses JS \s (U+FEFF in, U+0085 out) and its byte
    # decoding drops a U+FEFF (BOM) at the start of a byte run.  Inputs with
    # those characters are left out where they would hit those paths.
    texts = {
        "sp": base + [story()] + random_texts(1, 150, ["\ufeff"]),
        "gpt2": base + [story()] + random_texts(2, 150, ["\ufeff", "\u0085"]),
        "split": base + ["a\u0085b\ufeffc \u0085 x"] + [story()] + random_texts(3, 150, []),
    }
    for k, v in texts.items():
        with open(os.path.join(HERE, "texts_%s.json" % k), "w", encoding="utf-8") as f:
            json.dump(v, f, ensure_ascii=False, indent=0)
            f.write("\n")


if __name__ == "__main__":
    main()
