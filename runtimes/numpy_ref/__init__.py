"""The numpy reference interpreter. Importing the package fills the kernel table."""
from qir.runtimes.numpy_ref import kernels  # noqa: F401  (each kernel module registers itself)
