"""The reference programs behind tests/reference/hf_llama.py, one module per subcommand (make_lora,
make_tiny, logits, val_loss, generate, train, fsdp2_grads), each with its add_parser(sub) and
run(args), and what they share in common. hf_llama.py is the command line; import it (or
hf_ref.common) for the functions."""

# The subcommands' modules in the order hf_llama.py lists them.
COMMANDS = ["make_lora", "make_tiny", "logits", "val_loss", "generate", "train", "fsdp2_grads"]
