"""A small ImageNet-style training script written for CUDA (the layout of
pytorch/examples' imagenet/main.py: argparse, a ResNet-like model, a
DataLoader with pinned memory, AMP with a GradScaler, cudnn.benchmark,
per-step synchronize for timing). Synthetic data stands in for the images.
Prints the final loss as JSON."""
import argparse
import json
import time

import torch
import torch.nn as nn
import torch.backends.cudnn as cudnn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser(description="ImageNet-style training")
parser.add_argument("--epochs", default=1, type=int)
parser.add_argument("-b", "--batch-size", default=8, type=int)
parser.add_argument("--lr", default=0.05, type=float)
parser.add_argument("--gpu", default=None, type=int, help="GPU id to use.")
parser.add_argument("--seed", default=0, type=int)
parser.add_argument("--amp", action="store_true", help="mixed precision")


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = nn.Sequential() if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.short(x))


class TinyResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.layers = nn.Sequential(Block(16, 16, 1), Block(16, 32, 2))
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def main():
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed(args.seed)
    model = TinyResNet()
    if args.gpu is not None:
        torch.cuda.set_device(args.gpu)
        model.cuda(args.gpu)
        device = torch.device("cuda:{}".format(args.gpu))
    elif torch.cuda.is_available():
        model = model.cuda()
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    cudnn.benchmark = True
    criterion = nn.CrossEntropyLoss().to(device)
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)
    scaler = torch.cuda.amp.GradScaler(enabled=args.amp)

    g = torch.Generator().manual_seed(args.seed)
    images = torch.randn(32, 3, 16, 16, generator=g)
    target = torch.randint(0, 10, (32,), generator=g)
    loader = DataLoader(TensorDataset(images, target), batch_size=args.batch_size, shuffle=False,
                        pin_memory=torch.cuda.is_available())
    model.train()
    loss_value = None
    for epoch in range(args.epochs):
        for i, (x, y) in enumerate(loader):
            t0 = time.time()
            if torch.cuda.is_available():
                x = x.cuda(non_blocking=True)
                y = y.cuda(non_blocking=True)
            with torch.cuda.amp.autocast(enabled=args.amp):
                output = model(x)
                loss = criterion(output, y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            loss_value = loss.item()
            print(f"epoch {epoch} step {i} loss {loss_value:.4f} {time.time() - t0:.3f}s")
    mem = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
    print(json.dumps({"loss": loss_value, "device": str(device), "max_memory": mem}))


if __name__ == "__main__":
    main()
