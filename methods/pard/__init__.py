"""PARD (AMD, arXiv 2504.18583): a draft model fine-tuned with mask tokens proposes K tokens in one forward
(prefix + K-1 mask tokens), verified by the target as a chain."""
