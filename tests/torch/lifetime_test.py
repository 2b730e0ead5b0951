"""The process group's lifetime: its last reference dropped inside a future's callback, on
one of the group's own completer threads, destroys it there without joining that thread
(which aborted the process with "Resource deadlock avoided"), and the callback's value
arrives."""
import datetime
import gc
import sys
import time

import torch
import torch.distributed as dist
import kolo_torch


def main():
    store = dist.HashStore()
    pg = kolo_torch.ProcessGroupKolo(store, 0, 1, datetime.timedelta(seconds=30))
    t = torch.ones(1 << 16)
    fut = pg.allreduce([t]).get_future()

    def holding(group):
        def callback(f):
            time.sleep(0.2)  # the caller drops its references meanwhile
            return group.rank() + float(f.value()[0][0])
        return callback

    chained = fut.then(holding(pg))
    del pg, fut
    gc.collect()
    value = chained.wait()
    del chained
    time.sleep(0.3)  # the completer ends after the group is gone
    if value != 1.0:
        sys.exit(f"the callback returned {value}, expected 1.0")
    print("the group's last reference went on its completer: destroyed there, callback value 1.0")


if __name__ == "__main__":
    main()
