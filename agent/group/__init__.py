"""One SGLang service over several hosts (--nnodes): its nodes, the group change and its decisions."""
