"""The RL tests' shared start: `loom data arith` (2-digit addition) and a tiny Llama
trained on it for 5 steps (dense, or a mixture of experts), the policy loom rl starts from."""
import os

from loomtest import run


def arith_and_sft(loom, tmp, seed, n_train, n_val):
    """Returns (data folder, SFT weights path) under tmp."""
    d = os.path.join(tmp, "d")
    run([loom, "data", "arith", "--out", d, "--digits", "2", "--train", str(n_train), "--val",
         str(n_val), "--seed", str(seed)], "loom data arith")
    return d, sft_model(loom, tmp, d, seed, "sft")


def sft_model(loom, tmp, d, seed, name, extra=()):
    """The tiny Llama trained 5 steps on d's examples (extra: more loom train flags, e.g. a
    mixture of experts); returns the weights' path under tmp."""
    sft = os.path.join(tmp, name + ".safetensors")
    run([loom, "train", "--family", "llama", "--vocab-size", "256", "--seq-len", "16",
         "--n-layer", "2", "--d-model", "32", "--n-head", "4", "--n-kv-head", "2", "--d-ff",
         "64", "--micro-batch", "8", "--global-batch", "8", "--steps", "5", "--lr", "3e-3",
         "--threads", "1", "--log-every", "0", "--seed", str(seed), "--data",
         d + "/train_*.bin", "--save-weights", sft] + list(extra), "the SFT model " + name)
    return sft
