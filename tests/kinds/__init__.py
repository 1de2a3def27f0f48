"""One kind of model each, end to end against its reference library (classifiers, span extractors, sparse and
multi-vector encoders, rerankers, prompted embedders)."""
