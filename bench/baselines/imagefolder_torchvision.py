"""One epoch of torchvision's ImageFolder + DataLoader over a folder of PNG files.

The baseline of bench/byo_data.sh: every file is opened and decoded by PIL (torchvision's
default loader), converted to grey and to a float tensor, and batched by 64 in file order.
Prints RESULT epoch_s=... samples=... label_sum=... (the epoch includes building the ImageFolder, which lists
the folder, as fedfleet's epoch includes its listing).

    python3 imagefolder_torchvision.py ROOT --workers 2
"""
import argparse
import time

import torch
import torchvision
from torchvision import transforms


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("root")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()

    start = time.perf_counter()
    dataset = torchvision.datasets.ImageFolder(
        args.root, transform=transforms.Compose([transforms.Grayscale(1), transforms.ToTensor()]))
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=False,
                                         num_workers=args.workers)
    samples = 0
    label_sum = 0
    for x, y in loader:
        samples += x.shape[0]
        label_sum += int(y.sum())
    epoch_s = time.perf_counter() - start
    print(f"RESULT epoch_s={epoch_s:.3f} samples={samples} label_sum={label_sum}", flush=True)


if __name__ == "__main__":
    main()
