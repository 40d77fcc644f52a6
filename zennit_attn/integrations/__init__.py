"""zennit-attn inside other libraries: captum's attribution interface and inseq's methods."""
