"""A word-language-model training script written for CUDA (the layout of
pytorch/examples' word_language_model/main.py: --cuda flag, batchify,
an LSTM language model, truncated BPTT with repackaged hidden state,
gradient clipping). A synthetic corpus stands in for Wikitext-2.
Prints the final loss as JSON."""
import argparse
import json
import math

import torch
import torch.nn as nn

parser = argparse.ArgumentParser(description="LSTM language model")
parser.add_argument("--emsize", type=int, default=32)
parser.add_argument("--nhid", type=int, default=32)
parser.add_argument("--lr", type=float, default=5.0)
parser.add_argument("--clip", type=float, default=0.25)
parser.add_argument("--bptt", type=int, default=8)
parser.add_argument("--batch_size", type=int, default=4)
parser.add_argument("--seed", type=int, default=1111)
parser.add_argument("--cuda", action="store_true", default=False, help="use CUDA")
args = parser.parse_args()

torch.manual_seed(args.seed)
if torch.cuda.is_available():
    if not args.cuda:
        print("WARNING: You have a CUDA device, so you should probably run with --cuda")

device = torch.device("cuda" if args.cuda and torch.cuda.is_available() else "cpu")

ntokens = 50
g = torch.Generator().manual_seed(args.seed)
corpus = torch.randint(0, ntokens, (400,), generator=g)


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid):
        super().__init__()
        self.drop = nn.Dropout(0.0)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, 1)
        self.decoder = nn.Linear(nhid, ntoken)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.decoder.out_features)
        return nn.functional.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(1, bsz, self.rnn.hidden_size), weight.new_zeros(1, bsz, self.rnn.hidden_size))


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


def get_batch(source, i):
    seq_len = min(args.bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


train_data = batchify(corpus, args.batch_size)
model = RNNModel(ntokens, args.emsize, args.nhid).to(device)
criterion = nn.NLLLoss()
model.train()
hidden = model.init_hidden(args.batch_size)
total = 0.0
for batch, i in enumerate(range(0, train_data.size(0) - 1, args.bptt)):
    data, targets = get_batch(train_data, i)
    model.zero_grad()
    hidden = repackage_hidden(hidden)
    output, hidden = model(data, hidden)
    loss = criterion(output, targets)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-args.lr)
    total = loss.item()
if device.type == "cuda":
    torch.cuda.synchronize()
print(json.dumps({"loss": total, "ppl": math.exp(total), "device": str(device)}))
