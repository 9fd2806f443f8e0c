// Cosimulation top of a DIMM-NMP (coda.hw.nmp.DIMMNMP): NR = dimms * ranks RankNMPs, one
// coda_dram_device (dram_top.sv) per rank, HDL clocks, a command feeder and a job controller,
// so whole programs run with no Python per clock.
//
// Clocks (delays in fs, so that non-integer ratios are kept to 1e-6 or better): clk, the DRAM
// command clock, half period +TCK_HALF_FS (default 208333: DDR5-4800's 416.667 ps); with
// CDC=1 (the DIMM-NMP built with nme_clock) an independent NME clock nme_clk, half period
// +NME_HALF_FS, its own power-on reset, drives the ranks' NMEs, the command port and the
// command feeder; with CDC=0 nme_clk is clk. The simulator's event queue interleaves the two
// edges in time order (coincident edges: both sides sample the values before the edge).
//
// Rank i's DRAM device keeps its bursts in the rank memory the host maps too, the file
// +MEM_SHM=PREFIX with ".<i>" appended (coda_dram_device with CODA_DRAM_SHM; the scheme of the
// NME's ideal memory, cosim/shared_mem.py): the host writes the ranks' contents there and
// reads the results from there, nothing is loaded into or dumped from the simulator.
//
// cocotb drives the job port (tb_* signals, public) and waits for tb_ack to change:
//   OP_RUN  : $readmemh(+CMD_IN) into the command buffer (lines: {rank mask, 64-bit word} in
//             hex), empty every rank memory's list of written words, feed tb_ncmd words to
//             the DIMM-NMP, wait for its combined done, then for every rank's memory to drain
//             (mem_idle), and write +RES_OUT: one line per rank
//             "rank status l1 cycles ndirty <stat_*...>" (ndirty: words the rank wrote)
// Command log: +dram_cmds=FILE (per device, see coda_dram_device). tb_cycles counts the NME
// clock cycles from the first command word being presented to the combined done (inclusive),
// tb_dram_cycles the DRAM clock cycles of the same interval (equal with CDC=0).
`timescale 1ns/1fs

`ifndef DIMM_MODULE
`define DIMM_MODULE coda_dimm
`endif

module nmp_tb_top #(
    parameter int NR = 2, RANKS_PER_DIMM = 2, LANES = 4,
    parameter int BG_BITS = 3, BA_BITS = 2, ROW_BITS = 16, COL_BITS = 10, BL_BITS = 4,
    parameter int DATA_BITS = 512, RL = 42, STORE_BITS = 13,
    parameter int CMD_DEPTH = 1024, CDC = 0
);
    localparam logic [2:0] OP_RUN = 3'd3;
    localparam int NSTAT = 8;   // coda.hw.dram.controller.STAT_NAMES order

    longint tck_half_fs = 208333, nme_half_fs = 208333;
    initial begin
        void'($value$plusargs("TCK_HALF_FS=%d", tck_half_fs));
        void'($value$plusargs("NME_HALF_FS=%d", nme_half_fs));
    end
    logic clk = 1'b0;
    initial forever #(tck_half_fs * 1fs) clk = ~clk;

    logic [2:0] por_count = 3'd4;
    wire rst = (por_count != 0);
    always @(posedge clk) if (por_count != 0) por_count <= por_count - 3'd1;

    wire nme_clk, nme_rst;
    if (CDC != 0) begin : g_nme_clock
        logic c = 1'b0;
        initial forever #(nme_half_fs * 1fs) c = ~c;
        logic [2:0] por = 3'd4;
        always @(posedge c) if (por != 0) por <= por - 3'd1;
        assign nme_clk = c;
        assign nme_rst = (por != 0);
    end else begin : g_one_clock
        assign nme_clk = clk;
        assign nme_rst = rst;
    end

    // ---------------------------------------------------------------- job port (cocotb)
    logic [31:0] tb_req /*verilator public_flat_rw*/ = 32'd0;
    logic [2:0]  tb_op /*verilator public_flat_rw*/ = 3'd0;
    logic [15:0] tb_ncmd /*verilator public_flat_rw*/ = 16'd0;
    logic [31:0] tb_max_cycles /*verilator public_flat_rw*/ = 32'd100000000;
    logic [31:0] tb_ack /*verilator public_flat_rw*/ = 32'd0;
    logic [31:0] tb_cycles /*verilator public_flat_rw*/ = 32'd0;
    logic        tb_timeout /*verilator public_flat_rw*/ = 1'b0;
    logic        tb_error /*verilator public_flat_rw*/ = 1'b0;
    logic [15:0] tb_cmd_left /*verilator public_flat_rw*/ = 16'd0;
    logic [63:0] tb_clk_count /*verilator public_flat_rw*/ = 64'd0;
    logic [31:0] tb_dram_cycles /*verilator public_flat_rw*/ = 32'd0;

    import "DPI-C" function void coda_mem_run_start(input int h);
    import "DPI-C" function int coda_mem_ndirty(input int h);

    string cmd_in_path = "cmd_in.hex", res_out_path = "res_out.txt";
    initial begin
        void'($value$plusargs("CMD_IN=%s", cmd_in_path));
        void'($value$plusargs("RES_OUT=%s", res_out_path));
    end

    // ---------------------------------------------------------------- the DIMM-NMP
    logic cmd_valid, cmd_ready, busy, done, error;
    logic [63:0] cmd_data;
    logic [NR-1:0] cmd_ranks, rank_done, rank_busy, mem_idle;
    logic [3*NR-1:0] rank_status;
    logic [32*NR-1:0] rank_l1;
    logic [3*NR-1:0] d_kind;
    logic [BG_BITS*NR-1:0] d_bg;
    logic [BA_BITS*NR-1:0] d_ba;
    logic [ROW_BITS*NR-1:0] d_row;
    logic [COL_BITS*NR-1:0] d_col;
    logic [DATA_BITS*NR-1:0] d_wdata, d_rdata;
    logic [DATA_BITS/8*NR-1:0] d_wmask;
    logic [NR-1:0] d_rvalid;
    logic [48*NR-1:0] st [NSTAT];

    `DIMM_MODULE dut (
        .clk(clk), .rst(rst),
`ifdef NME_CLOCK
        .nme_clk(nme_clk), .nme_rst(nme_rst),
`endif
        .cmd_valid(cmd_valid), .cmd_ready(cmd_ready), .cmd_data(cmd_data), .cmd_ranks(cmd_ranks),
        .busy(busy), .done(done), .error(error), .rank_done(rank_done), .rank_busy(rank_busy),
        .rank_status(rank_status), .rank_l1(rank_l1), .mem_idle(mem_idle),
        .dram_cmd_kind(d_kind), .dram_cmd_bg(d_bg), .dram_cmd_ba(d_ba), .dram_cmd_row(d_row),
        .dram_cmd_col(d_col), .dram_cmd_wdata(d_wdata), .dram_cmd_wmask(d_wmask),
        .dram_rd_valid(d_rvalid), .dram_rd_data(d_rdata),
        .stat_reads(st[0]), .stat_writes(st[1]), .stat_row_hits(st[2]),
        .stat_row_misses(st[3]), .stat_row_conflicts(st[4]), .stat_read_latency(st[5]),
        .stat_cycles(st[6]), .stat_refreshes(st[7]));

    // ---------------------------------------------------------------- jobs
    // The job controller runs on clk (run start, drain, results); a run's feeder and its cycle
    // count run on nme_clk, started and ended by toggles (start_tog: clk -> nme_clk,
    // fin_tog: nme_clk -> clk).
    typedef enum logic [1:0] { J_IDLE, J_RUN, J_DRAIN } job_state_t;
    job_state_t jstate = J_IDLE;
    logic [63+NR:0] cmd_buf [CMD_DEPTH];
    logic [15:0] cmd_idx = 16'd0;
    logic [31:0] last_req = 32'd0;
    logic [31:0] rank_cycles [NR];
    logic [NR-1:0] rank_ended = '0;
    logic run_start = 1'b0, count_dirty = 1'b0;
    logic start_tog = 1'b0, start_seen = 1'b0, fin_tog = 1'b0, fin_seen = 1'b0;
    logic running = 1'b0;       // nme_clk domain: feeding / waiting for the combined done
    logic [2:0] settle = 3'd0;  // DRAM cycles of J_DRAIN before mem_idle is trusted
    logic [7:0] nme_ticks = 8'd0, drain_tick = 8'd0;   // NME cycles, free-running
    int ndirty [NR];

    assign cmd_valid = running && (cmd_idx < tb_ncmd);
    // run start / end events. With one clock (CDC=0) both blocks see the same edge, so the
    // feeder starts in the cycle the job is taken and the drain begins in the done cycle
    // (the cycle-exact schedule of the top before the NME clock existed: the refresh phase,
    // hence every count, is unchanged); with two clocks the toggles cross.
    wire run_taken = !rst && jstate == J_IDLE && tb_req != last_req && tb_op == OP_RUN;
    wire run_ends = running && (done || tb_cycles >= tb_max_cycles);
    wire start_evt = (CDC == 0) ? run_taken : (start_tog != start_seen);
    wire fin_evt = (CDC == 0) ? run_ends : (fin_tog != fin_seen);
    assign cmd_data = cmd_buf[cmd_idx[$clog2(CMD_DEPTH)-1:0]][63:0];
    assign cmd_ranks = cmd_buf[cmd_idx[$clog2(CMD_DEPTH)-1:0]][64 +: NR];

    for (genvar i = 0; i < NR; i++) begin : g_rank
        wire [2:0] kind = d_kind[3*i +: 3];
        wire [ROW_BITS+BA_BITS+BG_BITS+COL_BITS-BL_BITS-1:0] full =
            {d_row[ROW_BITS*i +: ROW_BITS], d_ba[BA_BITS*i +: BA_BITS], d_bg[BG_BITS*i +: BG_BITS],
             d_col[COL_BITS*i + BL_BITS +: COL_BITS - BL_BITS]};

        coda_dram_device #(.BG_BITS(BG_BITS), .BA_BITS(BA_BITS), .ROW_BITS(ROW_BITS),
            .COL_BITS(COL_BITS), .BL_BITS(BL_BITS), .DATA_BITS(DATA_BITS), .RL(RL),
            .STORE_BITS(STORE_BITS), .CHANNEL(i / RANKS_PER_DIMM), .RANK(i % RANKS_PER_DIMM),
            .SHM_INDEX(i)) dev (
            .clk(clk), .rst(rst), .cmd_kind(kind), .cmd_bg(d_bg[BG_BITS*i +: BG_BITS]),
            .cmd_ba(d_ba[BA_BITS*i +: BA_BITS]), .cmd_row(d_row[ROW_BITS*i +: ROW_BITS]),
            .cmd_col(d_col[COL_BITS*i +: COL_BITS]),
            .cmd_wdata(d_wdata[DATA_BITS*i +: DATA_BITS]),
            .cmd_wmask(d_wmask[DATA_BITS/8*i +: DATA_BITS/8]),
            .rd_valid(d_rvalid[i]), .rd_data(d_rdata[DATA_BITS*i +: DATA_BITS]));

        always @(posedge clk) begin
            if (run_start) coda_mem_run_start(dev.shm);
            if (count_dirty) ndirty[i] = coda_mem_ndirty(dev.shm);
        end
    end

    task automatic write_results();
        int fd;
        fd = $fopen(res_out_path, "w");
        for (int i = 0; i < NR; i++) begin
            $fwrite(fd, "%0d %0d %0d %0d %0d", i, rank_status[3*i +: 3], rank_l1[32*i +: 32],
                    rank_cycles[i], ndirty[i]);
            for (int s = 0; s < NSTAT; s++) $fwrite(fd, " %0d", st[s][48*i +: 48]);
            $fwrite(fd, "\n");
        end
        $fclose(fd);
    endtask

    // count_dirty runs in the rank blocks at the edge after it is set; results the edge after.
    logic results_due = 1'b0;
    always @(posedge clk) begin
        tb_clk_count <= tb_clk_count + 64'd1;
        run_start <= 1'b0; count_dirty <= 1'b0;
        results_due <= count_dirty;
        if (results_due) begin
            write_results();
            tb_ack <= last_req;
        end
        if (!rst) begin
            if (running) tb_dram_cycles <= tb_dram_cycles + 32'd1;
            case (jstate)
                J_IDLE: begin
                    if (tb_req != last_req) begin
                        last_req <= tb_req;
                        case (tb_op)
                            OP_RUN: begin
                                $readmemh(cmd_in_path, cmd_buf);
                                run_start <= 1'b1;
                                tb_dram_cycles <= 32'd0;
                                start_tog <= ~start_tog;
                                jstate <= J_RUN;
                            end
                            default: tb_ack <= tb_req;
                        endcase
                    end
                end
                J_RUN: begin
                    if (fin_evt) begin
                        fin_seen <= ~fin_seen;
                        settle <= (CDC == 0) ? 3'd4 : 3'd0;
                        drain_tick <= nme_ticks;
                        jstate <= J_DRAIN;
                    end
                end
                J_DRAIN: begin
                    // writes still queued in the adapters, the crossings or the controllers
                    // reach the devices before the results; mem_idle is trusted once 4 DRAM and
                    // 4 NME cycles have passed since the done (the last burst has left the
                    // adapter and passed the pointer synchronisers by then)
                    if (settle != 3'd4) settle <= settle + 3'd1;
                    else if (CDC != 0 && 8'(nme_ticks - drain_tick) < 8'd4) ;
                    else if (&mem_idle || tb_timeout) begin
                        count_dirty <= 1'b1;
                        jstate <= J_IDLE;
                    end
                end
                default: jstate <= J_IDLE;
            endcase
        end
    end

    // the run on the NME clock: feed the command words, count cycles, catch the done
    always @(posedge nme_clk) begin
        nme_ticks <= nme_ticks + 8'd1;
        if (!nme_rst) begin
            if (start_evt) begin
                start_seen <= ~start_seen;
                cmd_idx <= 16'd0;
                tb_cycles <= 32'd0;
                tb_timeout <= 1'b0;
                rank_ended <= '0;
                for (int i = 0; i < NR; i++) rank_cycles[i] <= 32'd0;
                running <= 1'b1;
            end else if (running) begin
                if (cmd_valid && cmd_ready) cmd_idx <= cmd_idx + 16'd1;
                for (int i = 0; i < NR; i++)
                    if (rank_done[i] && !rank_ended[i]) begin
                        rank_cycles[i] <= tb_cycles + 32'd1;
                        rank_ended[i] <= 1'b1;
                    end
                tb_cycles <= tb_cycles + 32'd1;
                if (run_ends) begin
                    tb_error <= error;
                    tb_timeout <= !done;
                    tb_cmd_left <= tb_ncmd - cmd_idx;
                    running <= 1'b0;
                    fin_tog <= ~fin_tog;
                end
            end
        end
    end
endmodule
