"""Small, self-made inputs for the integration tests (no hub): a word-level
tokenizer trained on a few random sentences, a tiny Llama saved next to it,
the sentences as a JSON-lines dataset."""
import json
import os

import torch

WORDS = ("the quick brown fox jumps over a lazy dog while seven small birds sing songs about rivers "
         "mountains and quiet towns under the bright morning sun").split()
LLAMA = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=64, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=3)


def sentences(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (int(k),), generator=g))
            for k in torch.randint(12, 40, (n,), generator=g)]


def tokenizer(lines):
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(lines, trainers.WordLevelTrainer(special_tokens=["<unk>", "<s>", "</s>", "<pad>"]))
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                                                eos_token="</s>", pad_token="<pad>")


def tiny_llama(seed=0):
    import transformers

    torch.manual_seed(seed)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**LLAMA))


def model_folder(root):
    """root/model (a saved tiny Llama and its tokenizer) and root/data.jsonl."""
    lines = sentences()
    tokenizer(lines).save_pretrained(os.path.join(root, "model"))
    tiny_llama().save_pretrained(os.path.join(root, "model"))
    with open(os.path.join(root, "data.jsonl"), "w") as f:
        for line in lines:
            f.write(json.dumps({"text": line}) + "\n")
    return os.path.join(root, "model"), os.path.join(root, "data.jsonl")
