"""DFlash (Chen et al. 2026, "DFlash: Block Diffusion for Flash Speculative Decoding", arXiv 2602.06036; the `dflash`
package, z-lab's `*-DFlash*` checkpoints, SGLang's and vLLM's `dflash`)."""
