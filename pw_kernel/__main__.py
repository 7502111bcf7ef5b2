"""``python -m pw_kernel install [...]``: the Jupyter kernelspec; ``python -m pw_kernel serve [...]``: the service."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pw_kernel", description="pw_kernel command line.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    inst = sub.add_parser(
        "install",
        help='install the "Python 3 (Pathways)" Jupyter kernel',
        description='Install the "Python 3 (Pathways)" Jupyter kernelspec: ipykernel on this Python with '
        "`%%load_ext pw_kernel` done and, without an accelerator, N simulated CPU devices.",
    )
    where = inst.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="install for the current user (~/.local/share/jupyter)")
    where.add_argument("--sys-prefix", action="store_true", help=f"install into this environment ({sys.prefix})")
    where.add_argument("--prefix", metavar="DIR", help="install under DIR/share/jupyter/kernels")
    inst.add_argument("--devices", type=int, default=None, metavar="N", help="simulated CPU devices (default 8)")
    inst.add_argument("--name", default=None, help="kernelspec name (default 'pathways')")
    inst.add_argument("--display-name", default=None, help="name shown in Jupyter (default 'Python 3 (Pathways)')")
    srv = sub.add_parser(
        "serve",
        help="run the Pathways service: owns this host's devices, notebooks connect with pw.connect()",
        description="Run the Pathways service in the foreground: it owns this host's devices and runs the "
        "controller for every notebook that calls pw.connect(). It writes a connection file only this user can "
        "read; Ctrl-C or SIGTERM stops it and removes the file.",
    )
    srv.add_argument("--connection-file", default=None, metavar="PATH",
                     help="where to write the connection file (default: pw-service.json in Jupyter's runtime dir)")
    srv.add_argument("--state", default=None, metavar="DIR",
                     help="where kept trees (pw.keep) are written, to survive a restart of the service "
                     "(default: <connection file name>-state beside the connection file)")
    srv.add_argument("--ip", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this host only)")
    srv.add_argument("--devices", type=int, default=None, metavar="N",
                     help="simulated CPU devices when there is no accelerator (default 8)")
    srv.add_argument("--ray", default=None, metavar="ADDRESS",
                     help="also serve each node of this Ray cluster as an island ('auto': the running cluster; "
                     "'local': a Ray started here on 127.0.0.1)")
    srv.add_argument("--ray-devices", type=int, default=None, metavar="N",
                     help="simulated CPU devices per Ray node (without accelerators)")
    srv.add_argument("--dashboard", type=int, default=None, metavar="PORT",
                     help="also serve a web page of the pool (every client's nodes on each device, shares, queues, "
                     "memory) on http://127.0.0.1:PORT/ (0: a free port)")
    srv.add_argument("--exit-with", type=int, default=None, metavar="PID",
                     help="stop, as on SIGTERM, once process PID has ended (a service a script starts for itself)")
    args = parser.parse_args(argv)

    if args.command == "serve":
        return _serve(args, parser)
    if args.command != "install":
        parser.print_help()
        return 2
    from .magics import kernelspec

    devices = kernelspec.DEFAULT_CPU_DEVICES if args.devices is None else args.devices
    if devices < 1:
        parser.error(f"--devices must be at least 1; got {devices}.")
    path = kernelspec.install(
        user=args.user,
        prefix=sys.prefix if args.sys_prefix else args.prefix,
        devices=devices,
        name=args.name or kernelspec.KERNEL_NAME,
        display_name=args.display_name or kernelspec.DISPLAY_NAME,
    )
    print(f"Installed kernelspec {args.name or kernelspec.KERNEL_NAME!r} ({devices} CPU devices) in {path}")
    return 0


def _serve(args, parser) -> int:
    import logging

    import jax

    if args.devices is not None:
        if args.devices < 1:
            parser.error(f"--devices must be at least 1; got {args.devices}.")
        jax.config.update("jax_num_cpu_devices", args.devices)  # (before JAX starts: nothing ran yet)
    if args.exit_with is not None:
        from .service.wire import pid_running

        if not pid_running(args.exit_with):
            parser.error(f"--exit-with: no process {args.exit_with} is running; give the pid of one that is.")
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    logging.getLogger("pw_kernel.service").setLevel(logging.INFO)  # clients coming and going, refusals
    from .service import serve

    serve(args.connection_file, ip=args.ip, state_dir=args.state, dashboard=args.dashboard, ray=args.ray,
          ray_devices=args.ray_devices, exit_with=args.exit_with)
    return 0


def serve_main(argv: list[str] | None = None) -> int:
    """``pw-serve [...]``: ``python -m pw_kernel serve [...]`` with the Python it was installed with."""
    return main(["serve", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
