"""Training without a Determined master: the trial under plain `torchrun`, on two machines (two
network namespaces on a switch, tests/support/det_netns.py), 1 process each over gloo -- it
runs, resumes from its latest checkpoint with `--resume latest`, and trains the same weights as
one process with the same global batch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support import det_netns
from tests.support.cli_result import last_json
from tests.support.project import DEV_V1, ROOT, one_process_scores, run_train, tiny_config, write_yaml


@pytest.fixture(scope="module")
def tiny_no_dropout(tokenizer: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny BERT without dropout: two ranks of 4 then train exactly what one process of 8 does."""
    import torch
    from transformers import BertConfig, BertForQuestionAnswering

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("tiny-no-dropout")
    BertForQuestionAnswering(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def weights(checkpoint: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(str(checkpoint / "hf" / "model.safetensors"))


def torchrun_on_two_machines(net: Any, args: list[str], tmp: Path, port: int) -> dict[str, Any]:
    """`torchrun --nnodes 2` on each machine as the README shows it; the chief's result line."""
    chief = net.machines[0][1]
    procs = []
    env = {k: v for k, v in os.environ.items() if k != "USE_TORCH_DISTRIBUTED"}
    # gloo finds its address from the host name, which the namespaces share: name the interface.
    env.update(OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", GLOO_SOCKET_IFNAME="eth0")
    for i, (ns, address) in enumerate(net.machines):
        command = ["ip", "netns", "exec", ns, sys.executable, "-m", "torch.distributed.run"]
        command += ["--nnodes", "2", "--nproc_per_node", "1", "--rdzv_backend", "c10d"]
        command += ["--rdzv_endpoint", f"{chief}:{port}", "--rdzv_id", "squad", "--local_addr", address]
        if i == 0:  # the rendezvous host: namespaces share one host name, so say which it is
            command += ["--rdzv_conf", "is_host=1"]
        command += ["train.py", *args]
        log = (tmp / f"machine{i}-{port}.log").open("w")
        procs.append(
            (subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True), log)
        )
    outputs = []
    for proc, log in procs:
        out, _ = proc.communicate(timeout=600)
        log.close()
        outputs.append(out)
        assert proc.returncode == 0, Path(log.name).read_text()[-4000:]
    return last_json(outputs[0])


def test_two_machines_without_a_master_train_resume_and_match_one_process(
    tiny_no_dropout: Path, tmp_path: Path
) -> None:
    if (why := det_netns.supported()) is not None:
        pytest.skip(f"two machines: {why}")
    conf = tiny_config(tiny_no_dropout, tmp_path)
    conf["hyperparameters"]["global_batch_size"] = 8
    conf["checkpoint_policy"] = "all"
    path = write_yaml(conf, tmp_path / "exp.yaml")
    # One process, the same global batch: 3 batches, then resumed to 6 (--batches is the total).
    alone = ["--config", str(path), "--checkpoint-dir", str(tmp_path / "one")]
    code, _, err = run_train([*alone, "--batches", "3"])
    assert code == 0, err
    code, single, err = run_train([*alone, "--resume", "latest", "--batches", "6"])
    assert code == 0, err
    store = ["--config", str(path), "--checkpoint-dir", str(tmp_path / "two")]
    with det_netns.machines(2) as net:
        first = torchrun_on_two_machines(net, [*store, "--batches", "3"], tmp_path, 29561)
        assert first["steps_completed"] == 3
        resumed = torchrun_on_two_machines(
            net, [*store, "--resume", "latest", "--batches", "6"], tmp_path, 29562
        )
    assert resumed["steps_completed"] == 6 and resumed["checkpoint"] != first["checkpoint"]
    two, one = weights(Path(resumed["checkpoint"])), weights(Path(single["checkpoint"]))
    assert two.keys() == one.keys()
    for name in one:
        assert (two[name] - one[name]).abs().max().item() < 1e-4, name
    assert resumed["last_train_loss"] == pytest.approx(single["last_train_loss"], abs=1e-4)
    # The two-machine run's validation scores what one process scores on its checkpoint.
    scores = one_process_scores(resumed["checkpoint"], DEV_V1, tmp_path)
    assert (scores["exact_match"], scores["f1"]) == (resumed["exact_match"], resumed["f1"])
