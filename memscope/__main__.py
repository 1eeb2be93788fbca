from memscope.cli import entry

entry()
