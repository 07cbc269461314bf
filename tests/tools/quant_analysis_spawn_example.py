"""QuantAnalysis' "Multi-machine Multi-GPU" example (seed 000_97d5263c36df69af, lines 131-335) with
qir's QuantAnalysis, line for line where qir allows it; ``tests/tools/test_quant_analysis_spawn.py``
runs it. The user's program spawns the ranks (``torch.multiprocessing.spawn``), sets MASTER_ADDR and
MASTER_PORT and calls ``dist.init_process_group`` itself (no torchrun, no RANK / WORLD_SIZE in the
environment); every rank reads its own share of the data through a ``DistributedSampler``, and
runs the same four QuantAnalysis steps; rank 0 writes the files.

What differs from the seed, and why:

- ``horizon_plugin_pytorch`` is not available: the calibration model is ``torch.ao.quantization``'s
  (QuantStub/DeQuantStub, a qconfig, ``prepare_qat``, observers disabled after calibration) instead
  of horizon's ``prepare(..., QconfigSetter(...))`` and ``set_fake_quantize(..., VALIDATION)``; there
  is no ``set_march`` (qir's fake quantization is the model's own FakeQuantize scales).
- ``Metric.ATOL`` is the string ``"ATOL"`` in qir.
- The backend is gloo where there is no CUDA (nccl and ``torch.cuda.set_device(rank)`` otherwise,
  as in the seed); qir itself computes on the CPU, and ``device_ids`` is accepted and unused.
- The dataset is drawn from a fixed seed, so that every rank holds the same dataset (the seed's
  ``torch.randn`` draws another one in every process), and its size, ``num_steps``, the checkpoint
  paths and the DataLoader workers (0 here) are arguments.
- A rank is ``node_rank * nproc_per_node`` plus the spawned process's index (the seed passes the
  index alone, which is the rank on one machine only), and its GPU that index.
"""
import copy
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.ao.quantization import DeQuantStub, QuantStub, disable_observer, get_default_qat_qconfig, prepare_qat
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from qir.tools.compat.quant_analysis import QuantAnalysis


# Example dataset. Please use the evaluation dataset when debugging
class ExampleDataset(Dataset):
    def __init__(self, size=10000, input_size=32):
        self.size = size
        self.data = torch.randn(size, 3, input_size, input_size, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return self.size

    def __getitem__(self, idx):
        return self.data[idx]


# Model definition
class ConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super(ConvNet, self).__init__()
        self.layer1 = nn.Sequential(
            nn.Conv2d(3, 16, kernel_size=3, stride=1, padding=1),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.layer2 = nn.Sequential(
            nn.Conv2d(16, 32, kernel_size=3, stride=1, padding=1),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )
        self.fc = nn.Linear(8 * 8 * 32, num_classes)
        self.quant = QuantStub()
        self.dequant = DeQuantStub()

    def forward(self, x):
        x = self.quant(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = x.reshape(x.size(0), -1)
        x = self.fc(x)
        x = self.dequant(x)
        return x


def prepare(float_net):
    """The calibration model of ``float_net`` (torch.ao's, in place of horizon's ``prepare``)."""
    calib_net = copy.deepcopy(float_net)
    calib_net.qconfig = get_default_qat_qconfig("qnnpack")
    return prepare_qat(calib_net.train())


def make_checkpoints(float_ckpt_path, calib_ckpt_path):
    """What the seed loads: a float checkpoint (random weights, fixed seed) and a calibration one
    (observers run on 8 batches of random data)."""
    torch.manual_seed(1)
    float_net = ConvNet()
    torch.save(float_net.state_dict(), float_ckpt_path)
    calib_net = prepare(float_net)
    with torch.no_grad():
        for _ in range(8):
            calib_net(torch.randn(4, 3, 32, 32))
    torch.save(calib_net.state_dict(), calib_ckpt_path)


def load_models(config):
    """The float model and its calibration model, from the checkpoints, set for validation."""
    float_net = ConvNet()
    # Load the trained float model checkpoint.
    float_ckpt = torch.load(config["float_ckpt"])
    float_net.load_state_dict(float_ckpt)
    # Convert floating point model to calib model
    calib_net = prepare(float_net)
    # Load the calibration checkpoint.
    calib_ckpt = torch.load(config["calib_ckpt"])
    calib_net.load_state_dict(calib_ckpt)
    # Important!!! Set the calibration model into validation state
    float_net.eval()
    calib_net.eval().apply(disable_observer)
    return float_net, calib_net


def setup(rank, world_size, master_addr, master_port, local_rank=0):
    """Initialize the distributed environment"""
    os.environ["MASTER_ADDR"] = master_addr
    os.environ["MASTER_PORT"] = str(master_port)
    # Initialize process group
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)  # set current GPU


def cleanup():
    """Cleaning up the distributed training environment"""
    dist.destroy_process_group()


def quant_analysis(local_rank, world_size, config):
    rank = config["node_rank"] * config["nproc_per_node"] + local_rank
    setup(rank, world_size, config["master_addr"], config["master_port"], local_rank)

    # prepare, must use DistributedSampler
    dataset = ExampleDataset(size=config["dataset_size"])
    sampler = DistributedSampler(
        dataset,
        num_replicas=world_size,
        rank=rank,
        shuffle=False,
    )
    dataloader = DataLoader(
        dataset,
        batch_size=1,  # It is recommended to set batch = 1 when debugging
        sampler=sampler,
        num_workers=config["num_workers"],
        pin_memory=True,
    )

    float_net, calib_net = load_models(config)

    # debug
    qa = QuantAnalysis(
        baseline_model=float_net,
        analysis_model=calib_net,
        analysis_model_type="fake_quant",
        device_ids=local_rank,  # Set device_ids to the current rank (its GPU)
        out_dir=config["output_dir"],
    )
    qa.auto_find_bad_case(
        data_generator=dataloader,
        num_steps=config["num_steps"],
        metric="ATOL",
    )
    qa.run()
    qa.compare_per_layer()
    qa.sensitivity(metric="ATOL")

    # Cleaning up the distributed training environment
    cleanup()


def main():
    import argparse

    parser = argparse.ArgumentParser(description="Multi-Node QuantAnalysis")
    parser.add_argument("--nnodes", type=int, default=1, help="number of nodes in the cluster")
    parser.add_argument("--nproc_per_node", type=int, default=max(1, torch.cuda.device_count()),
                        help="number of processes (GPUs) per node")
    parser.add_argument("--node_rank", type=int, default=0, help="rank of this node in the cluster (0-indexed)")
    parser.add_argument("--master_addr", type=str, default="localhost",
                        help="IP address of the master node (node with rank 0)")
    parser.add_argument("--master_port", type=int, default=29500, help="port on master node for communication")
    parser.add_argument("--num_workers", type=int, default=0, help="number of data loader workers per process")
    parser.add_argument("--output_dir", type=str, default="./quant_analysis_output",
                        help="directory to save debug outputs")
    parser.add_argument("--float_ckpt", type=str, required=True, help="the float model's checkpoint")
    parser.add_argument("--calib_ckpt", type=str, required=True, help="the calibration model's checkpoint")
    parser.add_argument("--dataset_size", type=int, default=10000)
    parser.add_argument("--num_steps", type=int, default=100, help="samples each rank searches")
    args = parser.parse_args()

    os.makedirs(args.output_dir, exist_ok=True)
    config = {
        "master_addr": args.master_addr,
        "master_port": args.master_port,
        "num_workers": args.num_workers,
        "output_dir": args.output_dir,
        "float_ckpt": args.float_ckpt,
        "calib_ckpt": args.calib_ckpt,
        "dataset_size": args.dataset_size,
        "num_steps": args.num_steps,
        "node_rank": args.node_rank,
        "nproc_per_node": args.nproc_per_node,
    }
    # Calculating the global world size
    world_size = args.nnodes * args.nproc_per_node
    # Print configuration information
    if args.node_rank == 0:
        print("Starting multi-node QuantAnalysis with:")
        print(f" Nodes: {args.nnodes}")
        print(f" Processes per node: {args.nproc_per_node}")
        print(f" World size: {world_size}")
        print(f" Master address: {args.master_addr}:{args.master_port}")
    # Start distributed debugging
    mp.spawn(quant_analysis, args=(world_size, config), nprocs=args.nproc_per_node, join=True)


if __name__ == "__main__":
    main()
