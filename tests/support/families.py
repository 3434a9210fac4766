"""Tiny random-initialised models of each encoder family, each with a tokenizer of that family's
kind trained here on the bundled SQuAD text (WordPiece, byte-level BPE, SentencePiece Unigram)
and saved so `AutoTokenizer` / `AutoModelForQuestionAnswering` load them as that family's own.
Offline and small: a family takes a second or two to build."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from extractive_qa.io.files import ROOT

FAMILIES = ("bert", "distilbert", "electra", "roberta", "xlm-roberta", "albert", "deberta-v2", "modernbert")
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def training_text() -> list[str]:
    texts = []
    for name in ("train-v1.1-excerpt.json", "dev-v2.0-excerpt.json", "dev-v1.1-excerpt.json"):
        for article in json.loads((ROOT / "squad_data" / name).read_text())["data"]:
            for para in article["paragraphs"]:
                texts.append(para["context"])
                texts += [qa["question"] for qa in para["qas"]]
    # characters the excerpts lack, so accents, CJK and emoji are real tokens, not unknowns
    texts += ["Café Zürich naïve façade São Paulo 東京 北京大学 日本語 🙂 🚀 ❤️"] * 20
    return texts


def _bpe(specials: list[str]) -> Any:
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(training_text(), vocab_size=2000, special_tokens=specials)
    return bpe._tokenizer


def _unigram(specials: list[str], unk: str) -> Any:
    from tokenizers import SentencePieceUnigramTokenizer

    uni = SentencePieceUnigramTokenizer()
    uni.train_from_iterator(training_text(), vocab_size=2000, special_tokens=specials, unk_token=unk)
    return uni._tokenizer


def _pair_template(raw: Any, cls: str, sep: str, double_sep: bool, types: bool) -> None:
    from tokenizers import processors

    second = "1" if types else "0"
    middle = f"{sep} {sep}:{second}" if double_sep else f"{sep}"
    raw.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}",
        pair=f"{cls} $A {middle} $B:{second} {sep}:{second}",
        special_tokens=[(cls, raw.token_to_id(cls)), (sep, raw.token_to_id(sep))],
    )


def build(family: str, directory: Path) -> Path:
    """A tiny model of `family` with its tokenizer, saved in `directory`."""
    import torch
    import transformers as tf

    from extractive_qa.config.model_family import EMBEDDED_MODEL
    from extractive_qa.data.features import load_tokenizer

    torch.manual_seed(0)
    wordpiece = load_tokenizer(EMBEDDED_MODEL).backend_tokenizer
    bert_specials = {
        "cls_token": "[CLS]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "unk_token": "[UNK]",
        "mask_token": "[MASK]",
    }
    if family in ("bert", "distilbert", "electra"):
        cls_name = {
            "bert": "BertTokenizerFast",
            "distilbert": "DistilBertTokenizerFast",
            "electra": "ElectraTokenizerFast",
        }[family]
        tokenizer = getattr(tf, cls_name)(tokenizer_object=wordpiece, **bert_specials)
    elif family in ("roberta", "xlm-roberta"):
        specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
        raw = _bpe(specials) if family == "roberta" else _unigram(specials, "<unk>")
        _pair_template(raw, "<s>", "</s>", double_sep=True, types=False)
        cls_name = "RobertaTokenizerFast" if family == "roberta" else "XLMRobertaTokenizerFast"
        tokenizer = getattr(tf, cls_name)(
            tokenizer_object=raw,
            bos_token="<s>",
            eos_token="</s>",
            sep_token="</s>",
            cls_token="<s>",
            unk_token="<unk>",
            pad_token="<pad>",
            mask_token="<mask>",
        )
    elif family in ("albert", "deberta-v2"):
        raw = _unigram(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"], "[UNK]")
        _pair_template(raw, "[CLS]", "[SEP]", double_sep=False, types=True)
        cls_name = "AlbertTokenizerFast" if family == "albert" else "DebertaV2TokenizerFast"
        extra = {"do_lower_case": False} if family == "albert" else {}
        tokenizer = getattr(tf, cls_name)(tokenizer_object=raw, **bert_specials, **extra)
    elif family == "modernbert":
        raw = _bpe(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
        _pair_template(raw, "[CLS]", "[SEP]", double_sep=False, types=False)
        tokenizer = tf.PreTrainedTokenizerFast(
            tokenizer_object=raw, model_input_names=["input_ids", "attention_mask"], **bert_specials
        )
    else:
        raise ValueError(family)
    ids = {"pad_token_id": tokenizer.pad_token_id}
    vocab = len(tokenizer)
    if family == "bert":
        model = tf.BertForQuestionAnswering(tf.BertConfig(vocab_size=vocab, **TINY, **ids))
    elif family == "distilbert":
        config = tf.DistilBertConfig(vocab_size=vocab, dim=32, n_layers=2, n_heads=2, hidden_dim=64, **ids)
        model = tf.DistilBertForQuestionAnswering(config)
    elif family == "electra":
        model = tf.ElectraForQuestionAnswering(
            tf.ElectraConfig(vocab_size=vocab, embedding_size=32, **TINY, **ids)
        )
    elif family in ("roberta", "xlm-roberta"):
        config_cls = tf.RobertaConfig if family == "roberta" else tf.XLMRobertaConfig
        config = config_cls(
            vocab_size=vocab,
            max_position_embeddings=514,
            type_vocab_size=1,
            **TINY,
            **ids,
            bos_token_id=tokenizer.cls_token_id,
            eos_token_id=tokenizer.sep_token_id,
        )
        model_cls = (
            tf.RobertaForQuestionAnswering if family == "roberta" else tf.XLMRobertaForQuestionAnswering
        )
        model = model_cls(config)
    elif family == "albert":
        model = tf.AlbertForQuestionAnswering(
            tf.AlbertConfig(vocab_size=vocab, embedding_size=16, **TINY, **ids)
        )
    elif family == "deberta-v2":
        config = tf.DebertaV2Config(
            vocab_size=vocab,
            **TINY,
            **ids,
            relative_attention=True,
            position_buckets=64,
            pos_att_type=["p2c", "c2p"],
            position_biased_input=False,
            max_relative_positions=-1,
            type_vocab_size=0,
        )
        model = tf.DebertaV2ForQuestionAnswering(config)
    else:
        config = tf.ModernBertConfig(
            vocab_size=vocab,
            **TINY,
            **ids,
            cls_token_id=tokenizer.cls_token_id,
            sep_token_id=tokenizer.sep_token_id,
            max_position_embeddings=512,
            local_attention=64,
        )
        model = tf.ModernBertForQuestionAnswering(config)
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def table() -> list[dict[str, str]]:
    """Per family, what this transformers gives: QA class, attention `auto` picks, token types."""
    import tempfile

    import transformers

    from extractive_qa.config.model_family import qa_model_class, resolve_attention, supported_attention
    from extractive_qa.data.features import load_tokenizer

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in FAMILIES:
            path = str(build(family, Path(tmp) / family))
            cls = qa_model_class(path)
            tokenizer = load_tokenizer(path)
            rows.append(
                {
                    "family": family,
                    "class": cls.__name__,
                    "attention (auto)": resolve_attention("auto", path)[0],
                    "supported": ", ".join(supported_attention(cls)),
                    "token types": "yes" if "token_type_ids" in tokenizer.model_input_names else "no",
                    "transformers": transformers.__version__,
                }
            )
    return rows


if __name__ == "__main__":  # python3 -m tests.support.families: the table in docs/models.md
    for row in table():
        print(json.dumps(row))
