"""runtime/pipelines"""
